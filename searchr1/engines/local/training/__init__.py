"""The local engine's training client: packed forward/backward, chunked log-probs, AdamW, checkpoints, the PPO critic."""
