"""The embedded world: a seeded fictional encyclopedia used as the offline default data.

``generate_world(WorldConfig())`` builds, in well under two seconds and without any file, a
corpus of wiki-style passages about fictional people, cities, organisations and creative
works, plus train/dev/test questions whose answers exist only in that corpus. It is built to
be hard enough that reinforcement learning has something to learn (a single-template world
was solved to ~95% EM by a short SFT of a 135M model):

- several phrasings per relation, both in questions and in passages;
- subjects named by description or by a former name, so searching the question verbatim
  misses and a reformulated query (the real name) is needed (``meta["needs_reformulation"]``);
- facts spread over several section passages per entity, with noise years and names;
- distractor entities with near-duplicate names and different facts;
- 1-, 2- and 3-hop chains and year comparisons, where no hop's answer leaks into an earlier one.

Train, dev and test are disjoint by subject entity: the entities questions are about are
partitioned before any question is drawn. Each stage draws from its own RNG derived from the
seed, so e.g. asking for more questions does not change the corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from searchr1.data.types import Dataset, QAExample
from searchr1.data.world_entities import World, build_entities
from searchr1.data.world_questions import QUESTION_KINDS, QuestionMaker
from searchr1.data.world_relations import ENTITY_KINDS
from searchr1.data.world_render import render_corpus
from searchr1.utils.schema import ranged

_SPLITS = ("train", "dev", "test")
#: Bump whenever a change to the generator changes the world drawn from a given seed: it keys
#: caches of anything derived from the world (e.g. the warm start, searchr1/warmstart/cache.py).
WORLD_GENERATOR_VERSION = 1


@dataclass
class WorldConfig:
    """Schema and defaults of ``data=world``; the defaults give ~1.1k passages, 550 questions."""

    name: str = "world"  # dataset name, used in logs and output paths
    seed: int = 0  # one seed fixes the whole world: entities, passages, splits and questions
    num_people: int = 160  # people before distractors (each gets 3 passages)
    num_cities: int = 40  # cities before distractors (2 passages each)
    num_orgs: int = 60  # organisations before distractors (2 passages each)
    num_works: int = 100  # creative works before distractors (2 passages each)
    distractor_ratio: float = 0.25  # extra near-duplicate-name entities, as a fraction of each kind
    train_questions: int = ranged(400, ge=0)  # questions in the train split
    dev_questions: int = ranged(50, ge=0)  # questions in the dev split
    test_questions: int = ranged(100, ge=0)  # questions in the test split
    # extra_test_questions: appended to test, about the test split's subjects, drawn last with
    # their own RNG, never needing a passage train or dev needs; train, dev, the corpus and the
    # first test_questions stay exactly as they are (a study's larger held-out set)
    extra_test_questions: int = 0  # more held-out questions (see above)
    kinds: list[str] = field(default_factory=lambda: list(QUESTION_KINDS))  # asked round-robin
    description_prob: float = 0.3  # chance a subject is described instead of named (when unique)
    alias_prob: float = 0.15  # chance a subject is called by its former / alternative name
    compare_np_prob: float = 0.35  # chance a comparison side is "the founder of X", not a name


@dataclass(frozen=True)
class BuiltWorld:
    """The world behind a dataset: entities, passage ids per (entity id, section), questions."""

    world: World
    section_ids: dict[tuple[str, str], str]
    dataset: Dataset


def generate_world(cfg: WorldConfig) -> Dataset:
    """Build the corpus and the three question splits for ``cfg``; deterministic per seed."""
    return build_world(cfg).dataset


def build_world(cfg: WorldConfig) -> BuiltWorld:
    """``generate_world`` plus the entity graph, for checks that need the underlying facts.

    Splits are drawn test first, then dev, then train, and a later split never uses a
    passage an earlier one needs: no fact a test question depends on (even as an
    intermediate hop) is ever needed by a training question.
    """
    _validate(cfg)
    world = build_entities(_rng(cfg.seed, "entities"), cfg.num_people, cfg.num_cities,
                           cfg.num_orgs, cfg.num_works, cfg.distractor_ratio)
    passages, section_ids = render_corpus(world, _rng(cfg.seed, "render"))
    maker = QuestionMaker(world, passages, section_ids, _rng(cfg.seed, "questions"),
                          cfg.description_prob, cfg.alias_prob, cfg.compare_np_prob)
    counts = {"train": cfg.train_questions, "dev": cfg.dev_questions, "test": cfg.test_questions}
    pools = partition_subjects(world, counts, _rng(cfg.seed, "splits"))
    splits: dict[str, list[QAExample]] = {}
    blocked: set[str] = set()
    seen: dict[str, set[tuple[str, ...]]] = {split: set() for split in _SPLITS}
    for split in reversed(_SPLITS):
        splits[split] = _split_questions(maker, split, counts[split], pools[split], cfg.kinds,
                                         blocked, seen[split])
        blocked.update(pid for example in splits[split] for pid in example.supporting_ids)
    if cfg.extra_test_questions:
        extra = QuestionMaker(world, passages, section_ids, _rng(cfg.seed, "extra-test"),
                              cfg.description_prob, cfg.alias_prob, cfg.compare_np_prob)
        trained = {pid for split in ("train", "dev") for ex in splits[split] for pid in ex.supporting_ids}
        splits["test"] += _split_questions(extra, "test", cfg.extra_test_questions, pools["test"],
                                           cfg.kinds, trained, seen["test"], first=len(splits["test"]))
    dataset = Dataset(splits["train"], splits["dev"], splits["test"], corpus=passages)
    return BuiltWorld(world, section_ids, dataset)


def _validate(cfg: WorldConfig) -> None:
    """Fail early, with the field's name, on a config the generator cannot satisfy."""
    unknown = sorted(set(cfg.kinds) - set(QUESTION_KINDS))
    if unknown or not cfg.kinds:
        valid = ", ".join(QUESTION_KINDS)
        raise ValueError(f"unknown world question kinds {unknown}; valid: {valid}")
    for name in ("train_questions", "dev_questions", "test_questions", "extra_test_questions"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"world {name} must be at least 0, got {getattr(cfg, name)}")
    for name in ("num_people", "num_cities", "num_orgs", "num_works"):
        if getattr(cfg, name) < 2:
            raise ValueError(f"world {name} must be at least 2, got {getattr(cfg, name)}")
    for name in ("distractor_ratio", "description_prob", "alias_prob", "compare_np_prob"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"world {name} must lie in [0, 1], got {getattr(cfg, name)}")


def partition_subjects(world: World, counts: dict[str, int],
                       rng: random.Random) -> dict[str, dict[str, list[str]]]:
    """Split every kind's entities into disjoint subject pools, sized like the splits.

    Returns ``{split: {entity kind: [entity id, ...]}}``. A split asking no questions gets
    no subjects; each other split gets at least two entities of each kind (comparisons
    need a pair).
    """
    total = sum(counts.values()) or 1
    pools: dict[str, dict[str, list[str]]] = {split: {} for split in _SPLITS}
    for kind in ENTITY_KINDS:
        ids = [e.id for e in world.of_kind(kind)]
        rng.shuffle(ids)
        start = 0
        for split in _SPLITS:
            size = 0 if not counts[split] else max(2, round(len(ids) * counts[split] / total))
            end = len(ids) if split == _SPLITS[-1] else min(len(ids), start + size)
            pools[split][kind] = ids[start:end] if counts[split] else []
            start = end if counts[split] else start
    return pools


def _split_questions(maker: QuestionMaker, split: str, count: int, pool: dict[str, list[str]],
                     kinds: list[str], blocked: set[str], seen: set[tuple[str, ...]],
                     first: int = 0) -> list[QAExample]:
    """``count`` questions about the split's subjects, kinds taken round-robin.

    Two drafts that need the same passages for the same answer count as one fact, whatever
    their wording, so a split never asks the same thing twice. Drafts needing a ``blocked``
    passage (one an evaluation split relies on) are redrawn. ``seen`` (updated) holds the facts
    the split already asks; ids count from ``first``.
    """
    examples: list[QAExample] = []
    for index in range(first, first + count):
        kind = kinds[index % len(kinds)]
        for _ in range(500):
            draft = maker.draft(kind, pool)
            key = (*draft.supporting_ids, draft.answer) if draft else ()
            if draft is not None and key not in seen and blocked.isdisjoint(draft.supporting_ids):
                break
        else:
            raise RuntimeError(f"could not draw a new {kind} question for the {split} split; "
                               "raise the entity counts or lower the question counts "
                               "(extra_test_questions included)")
        seen.add(key)
        examples.append(QAExample(
            id=f"world_{split}_{index}", question=draft.question,
            golden_answers=maker.golden_answers(draft), data_source=draft.data_source,
            supporting_ids=tuple(draft.supporting_ids), oracle_queries=tuple(draft.oracle_queries),
            meta=draft.meta))
    return examples


def _rng(seed: int, stage: str) -> random.Random:
    """An RNG for one generation stage, independent of the others but fixed by the seed."""
    return random.Random(f"searchr1-world:{seed}:{stage}")
