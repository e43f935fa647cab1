"""The step batch, a layer of its own: every datum of one RL step as typed columns.

Below the loop, the advantage estimators and the critic, which all read it; above the
leaves only (it imports no rollout, advantage, loop, engine or distributed module):

- ``shifted``: the shifted per-token layout of one datum and its truncation (pytrio's
  ``auto_shift=False``), the ignore label, and whether a length limit cuts a trajectory;
- ``step_batch``: ``StepBatch`` (flat ``_T`` / ``_D`` columns), built once from the selected
  trajectories (``build_step_batch``), and the update's packing ``Plan`` stored in it;
- ``microbatches``: first-fit-decreasing packing of datums into micro-batches.
"""
