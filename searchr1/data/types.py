"""Value types shared by every data source: questions and corpus passages."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QAExample:
    """One question with its gold answers.

    ``data_source`` names the benchmark or question kind (``nq``, ``hotpotqa``,
    ``world_2hop`` …) and keys the per-source metrics. ``supporting_ids`` and
    ``oracle_queries`` are known only for generated data (the embedded world).
    """

    id: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str
    supporting_ids: tuple[str, ...] = ()
    oracle_queries: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Passage:
    """A corpus row in the Search-R1 / FlashRAG format: ``contents = '"Title"\\ntext'``."""

    id: str
    contents: str

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0].strip().strip('"')

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) > 1 else ""

    def to_row(self) -> dict[str, str]:
        return {"id": self.id, "contents": self.contents}


SPLITS = ("train", "dev", "test")  # the splits every data set has (a split may be empty)


@dataclass(frozen=True)
class Dataset:
    """Splits of questions plus the corpus they are answered from (``None`` when remote)."""

    train: list[QAExample]
    dev: list[QAExample]
    test: list[QAExample]
    corpus: list[Passage] | None = None

    def split(self, name: str) -> list[QAExample]:
        """The split called ``name`` (train | dev | test)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; valid: {', '.join(SPLITS)}")
        return getattr(self, name)
