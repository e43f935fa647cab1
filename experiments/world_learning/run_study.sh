#!/usr/bin/env bash
# The world-learning study as run (experiments/world_learning/README.md): on a host with two GPUs,
# the r32 warm start, the base model's eval, six RL arms side by side (three per GPU), and
# warm-start variants for the default's packaged asset (rank 8). Every process stops LIMIT
# seconds after the script started (the device's 10-minute calls); running the script again
# resumes every unfinished arm from its last checkpoint (trainer.resume=auto, save_every=10).
#   bash experiments/world_learning/run_study.sh            # R=outputs/world_learning
#   EXPS=paper_grpo_world LIMIT=400 bash experiments/world_learning/run_study.sh  # only those arms
# With OUT set, the metrics, step-0 trajectories and variant adapters are packed into $OUT.
export PYTHONPATH=$PWD:$PYTHONPATH TOKENIZERS_PARALLELISM=false JAX_PLATFORMS=cpu OMP_NUM_THREADS=4
R=${R:-outputs/world_learning}; mkdir -p $R
LIMIT=${LIMIT:-540}
W="data.train_questions=1500 data.test_questions=240 rollout.max_searches=4 rollout.max_turns=5 rollout.max_observation_tokens=384 engine.kv_slots=136 engine.max_seq_len=2048"
if [ ! -d $R/sft_study/warmstart_adapter ]; then
  CUDA_VISIBLE_DEVICES=0 python3 -m searchr1.main mode=sft warmstart=oracle_sft model.lora_rank=32 model.lora_alpha=64 $W hydra.run.dir=$R/sft_study > $R/sft_study.log 2>&1
  echo "study warm start done at $SECONDS s"; tail -2 $R/sft_study.log
  CUDA_VISIBLE_DEVICES=0 python3 -m searchr1.main mode=eval warmstart=none $W eval.split=test eval.max_questions=null hydra.run.dir=$R/base > $R/base.log 2>&1 &
  # warm-start variants for the default's asset (rank 8, default world and rollout), then 3 default RL steps on 50 dev questions each
  V="mode=sft warmstart=oracle_sft model.lora_rank=8 model.lora_alpha=16 rollout.max_searches=4 rollout.max_turns=5"
  ( CUDA_VISIBLE_DEVICES=1 python3 -m searchr1.main $V warmstart.steps=200 hydra.run.dir=$R/v200 > $R/v200.log 2>&1 &
    CUDA_VISIBLE_DEVICES=1 python3 -m searchr1.main $V warmstart.steps=200 warmstart.mix.fail_first=0.0 hydra.run.dir=$R/v200ff0 > $R/v200ff0.log 2>&1 &
    CUDA_VISIBLE_DEVICES=1 python3 -m searchr1.main $V warmstart.steps=120 warmstart.learning_rate=4e-4 hydra.run.dir=$R/v120lr > $R/v120lr.log 2>&1 &
    wait
    D="eval.max_questions=null trainer.steps=3"
    CUDA_VISIBLE_DEVICES=1 python3 -m searchr1.main $D hydra.run.dir=$R/d_embedded > $R/d_embedded.log 2>&1 &
    for v in v200 v200ff0 v120lr; do
      CUDA_VISIBLE_DEVICES=1 python3 -m searchr1.main $D warmstart=none warmstart.init_from=$R/$v/warmstart_adapter hydra.run.dir=$R/d_$v > $R/d_$v.log 2>&1 &
    done; wait; echo "variants done at $SECONDS s" ) &
fi
A="warmstart=none warmstart.init_from=$R/sft_study/warmstart_adapter model.lora_rank=32 model.lora_alpha=64 $W trainer.steps=100 trainer.questions_per_step=16 rollout.group_size=8 eval.split=test eval.max_questions=null trainer.eval_every=10 trainer.save_every=10 trainer.max_padded_tokens_per_microbatch=16000 trainer.resume=auto"
for seed in 1 2; do
  g=$((seed-1))
  for exp in ${EXPS:-paper_grpo_world lab_world}; do
    CUDA_VISIBLE_DEVICES=$g timeout $((LIMIT-SECONDS)) python3 -m searchr1.main experiment=$exp seed=$seed $A hydra.run.dir=$R/${exp}_s$seed >> $R/${exp}_s$seed.log 2>&1 &
  done
  CUDA_VISIBLE_DEVICES=$g timeout $((LIMIT-SECONDS)) python3 -m searchr1.main experiment=paper_grpo_world seed=$seed rollout.mask_observations=false $A hydra.run.dir=$R/unmasked_s$seed >> $R/unmasked_s$seed.log 2>&1 &
done
sleep 60; nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv
wait
echo "arms stopped at $SECONDS s"
for f in $R/*_s?/metrics.jsonl; do echo "$f $(wc -l < $f) rows, last step $(tail -1 $f | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()).get("step"))')"; done
[ -n "$OUT" ] || exit 0
cd $R && tar czf $OUT/results.tgz --exclude='checkpoints' --exclude='*.html' --exclude='eval/step_0000[1-9]*' --exclude='warmstart_adapter' --exclude='trajectories.jsonl' . 
tar czf $OUT/evaltraj.tgz $(ls -d */eval/step_000000/trajectories.jsonl d_*/eval/*/trajectories.jsonl 2>/dev/null)
tar czf $OUT/adapters.tgz $(ls -d v*/warmstart_adapter 2>/dev/null)
ls -la $OUT
