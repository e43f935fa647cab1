"""The RL loop: the trainer, one step as typed stages, the update, checkpoints, the LR schedule."""
