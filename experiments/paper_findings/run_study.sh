#!/usr/bin/env bash
# The paper-findings study (experiments/paper_findings/README.md), first tier: PPO vs GRPO, the
# retrieved-token mask, paper vs lab — 4 arms × 3 seeds from the packaged warm start, 100 RL steps
# of 16 questions × 8, greedy eval of the 400-question held-out set every 10 steps.
# Arms run side by side on the GPUs this host has (ARMS_PER_GPU each); every process stops LIMIT
# seconds after the script started (the device's 10-minute calls) and resumes from its last
# checkpoint when the script runs again (trainer.resume=auto, save_every=10).
# With OUT set, every arm's metrics, summaries and configs are packed into $OUT/study.tgz (no
# checkpoints: calls made back to back, while the machine is warm, resume from the ones on it;
# a fresh machine restarts unfinished arms from step 0). Estimate, not measured: 100 steps at
# 6.8 s alone and ~1.8x that shared (issue figures) + 10 evals: ~20 min per arm four to a GPU,
# so one session's 30 device minutes run one seed of the four arms.
#   source .gpu/setup.sh && OUT=$OUT bash experiments/paper_findings/run_study.sh
#   ARMS="grpo ppo" SEEDS="1" LIMIT=500 bash experiments/paper_findings/run_study.sh   # a subset
# Then, anywhere:  python -m searchr1.analysis.report outputs/paper_findings --out experiments/paper_findings
export PYTHONPATH=$PWD:$PYTHONPATH TOKENIZERS_PARALLELISM=false JAX_PLATFORMS=cpu OMP_NUM_THREADS=2
R=${R:-outputs/paper_findings}; mkdir -p "$R"
LIMIT=${LIMIT:-540}
SEEDS=${SEEDS:-1 2 3}
ARMS=${ARMS:-grpo ppo unmasked lab}
ARMS_PER_GPU=${ARMS_PER_GPU:-4}
# the held-out set: the world's 100 test questions + 300 more about the same held-out subjects
# (data.extra_test_questions: train, dev and the corpus the warm start saw are unchanged)
COMMON="warmstart=embedded data.extra_test_questions=300 eval.split=test eval.max_questions=null
  trainer.steps=100 trainer.questions_per_step=16 rollout.group_size=8 trainer.eval_every=10
  trainer.save_every=10 trainer.resume=auto engine.kv_slots=136 engine.max_seq_len=2048"
arm_overrides() {
  case $1 in
    grpo) echo "experiment=paper_grpo_world" ;;
    ppo) echo "experiment=paper_ppo_world" ;;
    unmasked) echo "experiment=paper_grpo_world rollout.mask_observations=false" ;;
    lab) echo "experiment=lab_world" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}
gpus=$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")
i=0
for seed in $SEEDS; do
  for arm in $ARMS; do
    dir=$R/${arm}_s$seed
    if [ -f "$dir/summary.json" ]; then echo "$dir done"; continue; fi
    gpu=$(( (i / ARMS_PER_GPU) % gpus )); i=$((i + 1))
    left=$((LIMIT - SECONDS)); [ $left -gt 30 ] || break 2
    # shellcheck disable=SC2046
    CUDA_VISIBLE_DEVICES=$gpu timeout $left python3 -m searchr1.main $(arm_overrides $arm) seed=$seed $COMMON \
      hydra.run.dir=$dir >> $R/${arm}_s$seed.log 2>&1 &
    if [ $((i % (ARMS_PER_GPU * gpus))) -eq 0 ]; then wait; fi
  done
done
wait
echo "arms stopped at $SECONDS s"
for f in "$R"/*_s*/metrics.jsonl; do
  [ -f "$f" ] && echo "$f: last step $(tail -1 "$f" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()).get("step"))')"
done
[ -n "$OUT" ] || exit 0
# metrics, summaries, eval summaries and configs (checkpoints stay on the machine: back-to-back
# calls find them while it is warm; one arm's last checkpoint is ~30 MB, so 12 do not fit a carry)
( cd "$R" && tar czf "$OUT/study.tgz" --exclude='checkpoints' --exclude='*.html' --exclude='trajectories.jsonl' \
    --exclude='wandb' --exclude='swanlog' ./*_s* )
ls -la "$OUT"
