#!/usr/bin/env bash
# The paper-findings study (experiments/paper_findings/README.md), first tier: PPO vs GRPO, the
# retrieved-token mask, paper vs lab — 4 arms × 3 seeds from the packaged warm start, 100 RL steps
# of 16 questions × 8, greedy eval of the 400-question held-out set every 10 steps.
#
#   bash run_study.sh [launch|wait [S]|status|pack|unpack DIR|arms|all]   (default all: launch, wait, pack)
# arms    prints every arm's command line (ARMS picks which run; the names are in arm_overrides)
# RUNS    names the runs to launch as ARM_sSEED (RUNS="unmasked_s2 lab_s1"); without it, every arm
#         of ARMS for every seed of SEEDS
#
# launch  starts every arm that has no summary.json and no live process, detached (setsid), so
#         it outlives the shell that started it; ARMS_PER_GPU arms share each GPU of the host,
#         and no more start while that many run (the rest say "not started": launch again later).
#         Every arm resumes from its last checkpoint (trainer.resume=auto, save_every=10).
# wait S  returns when no arm runs any more, or after S seconds, printing progress every 60 s.
#         FILL=1: every minute it also starts the runs (RUNS, or ARMS x SEEDS) never started in R
#         (no pid file) as running ones end, so a fourth arm takes the first finished one's place;
#         a run that was started and stopped is left alone (no restart loop on a crash).
# status  prints each arm's last logged step, the time it has left (progress.py) and whether it runs.
# pack    with OUT set: every arm's metrics, summaries, configs and per-question eval files
#         into $OUT/study.tgz (no checkpoints, no training trajectories), and, as far as one
#         call's 64 MiB allow, the unfinished arms' newest checkpoints as resume_<arm>-step<N>
#         files (carry_runs.py pack: arms take turns across packs, shared weights go once);
#         RESUME=0: study.tgz only.
# unpack DIR  rebuilds in R the newest checkpoint of each arm found in DIR (every earlier
#         pack's resume_* and blob_* files, carried over in calls of their own: carry_runs.py
#         plan DIR groups them), so `launch` resumes those arms where they stopped.
# On the device machine (10-minute calls; a detached arm runs on while the machine stays warm,
# i.e. while the next call comes within 30 s): the GGUF's parts travel first (gguf_parts.py),
# the call with the last one launches and waits, then `wait 540` calls back to back, each ending
# with `RESUME=0 OUT=$OUT ... pack` — the exact commands are in README.md (Commands). A fresh
# machine resumes unfinished arms from their resume archives (`unpack`), else from step 0.
# Then, anywhere:  python -m searchr1.analysis.report outputs/paper_findings --out experiments/paper_findings
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false JAX_PLATFORMS=cpu OMP_NUM_THREADS=2
R=${R:-outputs/paper_findings}; mkdir -p "$R"
SEEDS=${SEEDS:-1 2 3}
ARMS=${ARMS:-grpo ppo unmasked lab}
ARMS_PER_GPU=${ARMS_PER_GPU:-4}
# the engine's micro-batch (padded tokens per forward/backward): 12,000 for up to four arms per
# GPU; more arms have less memory each (six at 0.16 of an H200 ran out of memory at 12,000 on
# 2026-12-04), so 48,000 / ARMS_PER_GPU, never below one whole sequence (engine.max_seq_len).
# The gradient does not depend on it: every micro-batch is normalised by the whole call's totals
# (searchr1/loop/microbatches.py), and the report counts it as placement, not as an arm's setting.
MICRO=$(( ARMS_PER_GPU > 4 ? 48000 / ARMS_PER_GPU : 12000 )); MICRO=$(( MICRO < 2048 ? 2048 : MICRO ))
# the held-out set: the world's 100 test questions + 300 more about the same held-out subjects
# (data.extra_test_questions: train, dev and the corpus the warm start saw are unchanged)
COMMON="warmstart=embedded data.extra_test_questions=300 eval.split=test eval.max_questions=null
  trainer.steps=100 trainer.questions_per_step=16 rollout.group_size=8 trainer.eval_every=10
  trainer.save_every=10 trainer.resume=auto engine.kv_slots=136 engine.max_seq_len=2048
  trainer.max_padded_tokens_per_microbatch=$MICRO model.lora_compute=float32"
# arms sharing a GPU each take a share of its memory: without a cap, one arm's caching allocator
# and 64k-token micro-batches grew to 62-105 GiB and the others ran out of memory
FRACTION=$(python3 -c "print(round(0.96 / $ARMS_PER_GPU, 3))")
COMMON="$COMMON engine.memory_fraction=$FRACTION"
EXTRA=${EXTRA:-}  # more overrides for every arm; they win over COMMON's and the arm's own
arm_overrides() {  # tier 1, then tier 2 (search budget, reward, group size at ~128 trajectories, top-k)
  local grpo="experiment=paper_grpo_world"
  case $1 in
    grpo) echo "$grpo" ;;
    ppo) echo "experiment=paper_ppo_world" ;;
    unmasked) echo "$grpo rollout.mask_observations=false" ;;
    lab) echo "experiment=lab_world" ;;
    search1) echo "$grpo rollout.max_searches=1" ;;
    search2) echo "$grpo rollout.max_searches=2" ;;       # 4 is grpo
    reward_em_format_paper) echo "$grpo reward=em_format_paper" ;;
    reward_em_format) echo "$grpo reward=em_format" ;;    # em is grpo
    group2) echo "$grpo rollout.group_size=2 trainer.questions_per_step=64" ;;
    group5) echo "$grpo rollout.group_size=5 trainer.questions_per_step=26 trainer.minibatch_trajectories=65" ;;
    topk1) echo "$grpo retriever.topk=1" ;;
    topk5) echo "$grpo retriever.topk=5" ;;               # 3 is grpo
    *) echo "unknown arm $1 (run_study.sh arms lists them)" >&2; return 2 ;;
  esac
}
ALL_ARMS="grpo ppo unmasked lab search1 search2 reward_em_format_paper reward_em_format group2 group5 topk1 topk5"
# an arm's whole command line: EXTRA, the arm's overrides less the keys EXTRA sets, then COMMON
# less the keys either sets (Hydra refuses a key given twice)
without() {  # the words of $1 whose key no word of $2 sets
  local word out=""
  for word in $1; do
    case " $2 " in *" ${word%%=*}="*) ;; *) out="$out $word" ;; esac
  done
  echo "${out# }"
}
arm_command() {
  local overrides
  overrides=$(arm_overrides "$1") || return 2
  overrides="$(without "$overrides" "$EXTRA") $EXTRA seed=$2"
  echo "$overrides $(without "$COMMON" "$overrides")" | tr -s ' '
}
running() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
live_arms() {  # arms of R running now (pid files with a live process)
  local f n=0
  for f in "$R"/*.pid; do [ -f "$f" ] && running "$(basename "$f" .pid)" && n=$((n + 1)); done
  echo $n
}

# NVIDIA MPS: with it the arms' kernels share the GPU at once instead of taking turns (two sampler
# processes made 1.70x the tokens/s time-sliced ones did: experiments/benchmarks/gpu_sharing.py,
# 2026-12-04). On by default when arms share a GPU and the driver's control binary is on PATH;
# MPS=0 turns it off. The daemon's pipes live under $R/mps, so only the arms join it; it stops
# when `wait` sees no arm running.
MPS_DIR=$(mkdir -p "$R" && cd "$R" && pwd)/mps
mps_wanted() { [ "${MPS:-1}" != 0 ] && [ "$ARMS_PER_GPU" -gt 1 ] && command -v nvidia-cuda-mps-control >/dev/null; }
mps_running() { echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe nvidia-cuda-mps-control >/dev/null 2>&1; }
start_mps() {
  mps_wanted || return 0
  export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if mps_running; then echo "MPS daemon already up ($MPS_DIR)"; return 0; fi
  nvidia-cuda-mps-control -d && echo "MPS daemon started ($MPS_DIR)"
}
stop_mps() {
  command -v nvidia-cuda-mps-control >/dev/null && mps_running || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe nvidia-cuda-mps-control && echo "MPS daemon stopped"
}

runs() {  # the runs to launch, as ARM_sSEED: RUNS as given, else every arm of ARMS for every seed of SEEDS
  local seed arm name
  if [ -n "${RUNS:-}" ]; then
    for name in $RUNS; do
      case ${name##*_s} in
        ''|*[!0-9]*) echo "run $name: not ARM_sSEED (e.g. lab_s1)" >&2; return 2 ;;
      esac
      echo "$name"
    done
    return 0
  fi
  for seed in $SEEDS; do for arm in $ARMS; do echo "${arm}_s$seed"; done; done
}

launch() {  # launch fresh: only the runs never started in R (no pid file), and quietly (FILL)
  local fresh=${1:-} gpus live names name overrides gpu
  # counted once per script run: FILL's wait calls launch every minute, and importing torch
  # each time would take CPU from the arms
  GPUS=${GPUS:-$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))" 2>/dev/null || echo 1)}
  gpus=$GPUS
  names=$(runs) || exit 2
  if [ -n "$fresh" ]; then start_mps > /dev/null; else start_mps; fi
  for name in $names; do
    overrides=$(arm_command "${name%_s*}" "${name##*_s}") || exit 2
    if [ -n "$fresh" ] && [ -f "$R/$name.pid" ]; then continue; fi
    if [ -f "$R/$name/summary.json" ]; then [ -n "$fresh" ] || echo "$name: done"; continue; fi
    if running "$name"; then echo "$name: already running"; continue; fi
    # never more than ARMS_PER_GPU arms per GPU: each takes 1/ARMS_PER_GPU of its memory
    live=$(live_arms)
    if [ "$live" -ge $((ARMS_PER_GPU * gpus)) ]; then
      [ -n "$fresh" ] || echo "$name: not started ($((ARMS_PER_GPU * gpus)) arms fill the GPUs; launch again when one ends)"
      continue
    fi
    gpu=$(( (live / ARMS_PER_GPU) % gpus ))
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$gpu setsid nohup python3 -m searchr1.main $overrides \
      hydra.run.dir="$R/$name" >> "$R/$name.log" 2>&1 < /dev/null &
    echo $! > "$R/$name.pid"
    echo "$name: started on GPU $gpu (pid $!)"
  done
}

status() {
  local f name where here
  here=$(dirname "${BASH_SOURCE[0]}")
  for f in "$R"/*.pid; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .pid)
    # "step 57 of 100, ≈ 6.4 min left" (progress.py: recent step times and logged eval times)
    where=$(python3 "$here/progress.py" "$R/$name" 2>/dev/null || echo "step -")
    if [ -f "$R/$name/summary.json" ]; then state=done; elif running "$name"; then state=running; else state=stopped; fi
    echo "$(date -u +%T) $name: $where, $state"
  done
}

wait_arms() {
  local limit=${1:-1000000000} start=$SECONDS live f
  while :; do
    [ "${FILL:-0}" = 1 ] && launch fresh
    live=0
    for f in "$R"/*.pid; do [ -f "$f" ] && running "$(basename "$f" .pid)" && live=$((live + 1)); done
    [ $live -gt 0 ] && [ $((SECONDS - start)) -lt "$limit" ] || break
    sleep $(( 60 < limit - (SECONDS - start) ? 60 : limit - (SECONDS - start) ))
    status
  done
  echo "waited $((SECONDS - start)) s; $live arm(s) still running"
  [ $live -gt 0 ] || stop_mps
}

pack() {
  [ -n "${OUT:-}" ] || { echo "pack needs OUT" >&2; exit 2; }
  # the per-question eval files (eval/step_N/trajectories.jsonl) stay: the paired intervals need them
  ( cd "$R" && tar czf "$OUT/study.tgz" --exclude='checkpoints' --exclude='*.html' --exclude='wandb' \
      --exclude='swanlog' --no-wildcards-match-slash --exclude='./*_s*/trajectories.jsonl' ./*_s* )
  # each unfinished arm's newest checkpoint, so it resumes on the next machine (see unpack)
  # within what one call returns: 64 MiB and 8 files, study.tgz included. RESUME=0 packs the
  # evals and metrics only: ~50 MB of returned files take up to ~20 s after the call ends,
  # eating into the 30 s within which the next call must come to find the machine warm
  if [ "${RESUME:-1}" = 0 ]; then ls -la "$OUT"; return; fi
  local budget
  budget=$(python3 -c "import os; print(round(63 - os.path.getsize('$OUT/study.tgz') / 2**20, 1))")
  python3 "$(dirname "$0")/carry_runs.py" pack "$R" "$OUT" --budget-mb "$budget" --max-files 7
  ls -la "$OUT"
}

unpack() {  # the resume files of earlier packs (one folder) into R; launch then resumes those arms
  python3 "$(dirname "$0")/carry_runs.py" unpack "${1:?unpack needs the folder of resume_* files}" "$R"
}

case ${1:-all} in
  launch) launch ;;
  wait) wait_arms "${2:-1000000000}" ;;
  status) status ;;
  arms) for arm in $ALL_ARMS; do echo "$arm: $(arm_command "$arm" 1)"; done ;;
  pack) pack ;;
  unpack) unpack "${2:-}" ;;
  all) launch; wait_arms; status; [ -z "${OUT:-}" ] || pack ;;
  *) echo "usage: run_study.sh [launch|wait [S]|status|pack|unpack DIR|arms|all]" >&2; exit 2 ;;
esac
