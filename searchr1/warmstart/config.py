"""Schema of the ``warmstart`` config group (``conf/warmstart/``).

``name`` picks what happens before RL on a fresh run:

- ``none``: nothing (RL starts from the base model, or from ``init_from`` when set);
- ``oracle_sft``: supervised fine-tuning on oracle trajectories (``searchr1.warmstart.sft``),
  cached under the engine's cache dir by a fingerprint of everything it depends on;
- ``embedded``: load the adapter shipped in ``searchr1/warmstart/assets/<asset>/``, refused at
  start-up when its recorded fingerprint does not match the current model and protocol.

The YAML key for "start RL from saved adapters" is ``init_from`` (``from`` is a Python
keyword, so a dataclass field cannot carry that name).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MixConfig:
    """Shares of the oracle's choices; the three phrasing shares are normalised to sum 1."""

    name_only: float = 0.25  # a hop's query is the entity's name alone
    relation: float = 0.45  # name + relation words ("when was X born") — the generator's query
    question: float = 0.30  # question-like ("When was X born?", "What is the headquarters of X?")
    fail_first: float = 0.25  # first search is the question verbatim; a miss is reformulated
    no_search: float = 0.0  # answer at once, only for examples whose answer is knowable
    max_failed_searches: int = 1  # failed searches shown per trajectory (within the budget)


@dataclass
class WarmStartConfig:
    """The supervised warm start that runs before RL (see the module docstring)."""

    name: str = "none"  # none | oracle_sft | embedded
    steps: int = 60  # optimizer steps of SFT
    batch_size: int = 16  # oracle trajectories per step
    learning_rate: float = 2e-4  # Adam lr of the warm start (the RL lr is trainer.learning_rate)
    mix: MixConfig = field(default_factory=MixConfig)
    seed: int = 0  # seeds the oracle's choices and the trajectory order
    init_from: str | None = None  # saved adapters to start RL from (a directory, or "embedded")
    cache: bool = True  # reuse / store the SFT result under <engine cache_dir>/warmstart/<fp>/
    asset: str = "smollm2_135m_world_tags"  # embedded: folder under searchr1/warmstart/assets/
    heldout_questions: int = 32  # dev questions whose oracle cross-entropy is reported
