"""Questions over the generated world: single-hop, multi-hop chains and comparisons.

A question is a relation chain applied to a subject entity, phrased from the templates in
``world_relations``. The subject is named, described ("the violinist born in Tormi in 1919")
or called by a former name, so the question's own words often do not retrieve the passage
that answers it; each question records the passages an oracle needs (``supporting_ids``, in
hop order), the query it would issue for each (``oracle_queries``) and whether searching the
question verbatim is expected to fail (``meta["needs_reformulation"]``). Drafts whose answer
leaks into the question or into an earlier hop's passage are rejected, so every hop is needed.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from searchr1.data.types import Passage
from searchr1.data.world_entities import Entity, World
from searchr1.data.world_names import contains_phrase, normalize_text
from searchr1.data.world_relations import (
    COMPARISONS, REFERRALS, RELATION_BY_NAME, RELATIONS, Relation, chains,
)

HOPS_BY_KIND = {"world_1hop": 1, "world_2hop": 2, "world_3hop": 3}
QUESTION_KINDS = (*HOPS_BY_KIND, "world_compare")
# Longer forms of literal answers that are also accepted when a supporting passage uses them.
_ANSWER_FORMS = {"region": ("{v} Province",), "river": ("{v} River",)}


@dataclass
class Draft:
    """A question before it gets an id and a split."""

    question: str
    answer: str
    supporting_ids: list[str]
    oracle_queries: list[str]
    data_source: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Side:
    """One side of a comparison: how it is phrased and the entity whose year is compared."""

    phrase: str
    subject: str
    target: Entity
    passages: tuple[str, ...]
    queries: tuple[str, ...]
    template: str


class QuestionMaker:
    """Draws question drafts about subjects from a given pool, rejecting flawed ones."""

    def __init__(self, world: World, passages: list[Passage],
                 section_ids: dict[tuple[str, str], str], rng: random.Random,
                 description_prob: float, alias_prob: float, compare_np_prob: float) -> None:
        self.world, self.rng, self.section_ids = world, rng, section_ids
        self.text = {p.id: p.contents for p in passages}
        self.probs = (description_prob, alias_prob, compare_np_prob)
        self.chains = {hops: chains(hops) for hops in HOPS_BY_KIND.values()}
        self.describable = self._describable()

    def _describable(self) -> set[str]:
        """Ids of entities whose description facts single them out within their kind."""
        keys = {e.id: tuple(self.world.fields(e)[k] for k in REFERRALS[e.kind].key)
                for e in self.world.entities.values()}
        counts = Counter((self.world.entities[i].kind, key) for i, key in keys.items())
        return {i for i, key in keys.items() if counts[(self.world.entities[i].kind, key)] == 1}

    def passage(self, entity: Entity, relation: Relation) -> str:
        """Id of the passage that states ``relation`` of ``entity``."""
        return self.section_ids[(entity.id, relation.section)]

    def draft(self, kind: str, pool: dict[str, list[str]]) -> Draft | None:
        """One draft of the given question kind about subjects in ``pool``, or None."""
        if kind == "world_compare":
            return self.compare(pool)
        return self.chain_question(HOPS_BY_KIND[kind], kind, pool)

    def chain_question(self, hops: int, kind: str, pool: dict[str, list[str]]) -> Draft | None:
        """A ``hops``-relation question: subject → … → answer, as nested noun phrases."""
        chain = self.rng.choice(self.chains[hops])
        path = self._walk(chain, pool)
        if path is None:
            return None
        phrase, ids, queries, tags = self.refer(path[0], chain[0].section)
        for relation, entity in zip(chain[:-1], path):
            phrase, tag = self._pick(relation.np, f"{relation.name}.np", entity, phrase)
            tags.append(tag)
        question, tag = self._pick(chain[-1].ask, f"{chain[-1].name}.ask", path[-1], phrase)
        ids += [self.passage(entity, relation) for entity, relation in zip(path, chain)]
        queries += [self.query(relation, entity) for entity, relation in zip(path, chain)]
        meta = {"subjects": [path[0].id], "hops": hops, "template": "|".join(tags + [tag]),
                "needs_reformulation": len(ids) > 1, "answer_kind": chain[-1].dst}
        answer = self.world.value_name(path[-1], chain[-1].name)
        draft = Draft(_sentence(question), answer, ids, queries, kind, meta)
        return draft if self.sound(draft) else None

    def _walk(self, chain: tuple[Relation, ...],
              pool: dict[str, list[str]]) -> list[Entity] | None:
        """The entities a chain visits from a random subject in ``pool`` (None on a cycle)."""
        if not pool.get(chain[0].src):
            return None
        path = [self.world.entities[self.rng.choice(pool[chain[0].src])]]
        for relation in chain[:-1]:
            path.append(self.world.entities[str(path[-1].facts[relation.name])])
        visited = [e.id for e in path] + [str(path[-1].facts[chain[-1].name])]
        return path if len(set(visited)) == len(visited) else None

    def _pick(self, templates: tuple[str, ...], tag: str, entity: Entity,
              x: str) -> tuple[str, str]:
        """Fill one random template about ``entity`` named ``x``; returns (text, template tag)."""
        i = self.rng.randrange(len(templates))
        return templates[i].format(x=x, **self.world.fields(entity)), f"{tag}{i}"

    def query(self, relation: Relation, entity: Entity) -> str:
        """The oracle's search for ``relation`` of ``entity``, by the entity's real name."""
        return relation.query.format(x=entity.name, **self.world.fields(entity))

    def refer(self, subject: Entity,
              first_section: str) -> tuple[str, list[str], list[str], list[str]]:
        """How a question names its subject: (phrase, passage ids, queries, template tags).

        A description or former name is used only when stated in a different section from
        the first fact asked, so resolving it is a search of its own; its query is the
        phrase itself (or the former name), as a searcher would type it.
        """
        referral = REFERRALS[subject.kind]
        ref_ids = [self.section_ids[(subject.id, referral.section)]]
        draw = self.rng.random()
        desc_prob, alias_prob, _ = self.probs
        if referral.section != first_section:
            if draw < alias_prob and "alias" in subject.attrs and referral.alias:
                phrase, tag = self._pick(referral.alias, "alias", subject, subject.name)
                return phrase, ref_ids, [str(subject.attrs["alias"])], [tag]
            if draw < alias_prob + desc_prob and subject.id in self.describable:
                phrase, tag = self._pick(referral.describe, "desc", subject, subject.name)
                return phrase, ref_ids, [phrase], [tag]
        return subject.name, [], [], ["name"]

    def compare(self, pool: dict[str, list[str]]) -> Draft | None:
        """Which of two entities (named, or reached by one hop) has the earlier/later year."""
        kind = self.rng.choice(sorted(COMPARISONS))
        comparison = COMPARISONS[kind]
        year_rel = RELATION_BY_NAME[comparison.relation]
        a, b = self._side(kind, year_rel, pool), self._side(kind, year_rel, pool)
        if a is None or b is None or a.target.id == b.target.id or a.subject == b.subject:
            return None
        year_a, year_b = (int(side.target.facts[year_rel.name]) for side in (a, b))
        later = self.rng.random() < 0.35
        direction = "later" if later else "earlier"
        templates = comparison.later if later else comparison.earlier
        i = self.rng.randrange(len(templates))
        winner = a if (year_a < year_b) != later else b
        question = templates[i].format(a=a.phrase, b=b.phrase)
        named = winner.template == "name"
        if year_a == year_b or (not named and contains_phrase(question, winner.target.name)):
            return None
        meta = {"subjects": [a.subject, b.subject], "hops": max(len(a.passages), len(b.passages)),
                "template": f"{kind}.{direction}{i}|{a.template}|{b.template}",
                "needs_reformulation": (a.template, b.template) != ("name", "name"),
                "compared": [a.target.id, b.target.id], "direction": direction,
                "answer_kind": kind}
        draft = Draft(question, winner.target.name, [*a.passages, *b.passages],
                      [*a.queries, *b.queries], "world_compare", meta)
        return draft if self.sound(draft) else None

    def _side(self, kind: str, year_rel: Relation, pool: dict[str, list[str]]) -> _Side | None:
        """A comparison side: the entity itself by name, or one hop away ("the founder of X")."""
        prefixes = [r for r in RELATIONS if r.dst == kind and r.np and pool.get(r.src)]
        if prefixes and self.rng.random() < self.probs[2]:
            prefix = self.rng.choice(prefixes)
            subject = self.world.entities[self.rng.choice(pool[prefix.src])]
            target = self.world.entities[str(subject.facts[prefix.name])]
            phrase, tag = self._pick(prefix.np, f"{prefix.name}.np", subject, subject.name)
            ids = (self.passage(subject, prefix), self.passage(target, year_rel))
            queries = (self.query(prefix, subject), self.query(year_rel, target))
            return _Side(phrase, subject.id, target, ids, queries, tag)
        if not pool.get(kind):
            return None
        target = self.world.entities[self.rng.choice(pool[kind])]
        ids, queries = (self.passage(target, year_rel),), (self.query(year_rel, target),)
        return _Side(target.name, target.id, target, ids, queries, "name")

    def sound(self, draft: Draft) -> bool:
        """Reject drafts whose answer is missing from its passage or leaks earlier.

        The answer must be in the last supporting passage (for comparisons: in some
        supporting passage) and, outside comparisons, absent from the question and from
        every earlier passage, so no hop can be skipped.
        """
        texts = [self.text[pid] for pid in draft.supporting_ids]
        if draft.data_source == "world_compare":
            return any(contains_phrase(t, draft.answer) for t in texts)
        if contains_phrase(draft.question, draft.answer):
            return False
        if not contains_phrase(texts[-1], draft.answer):
            return False
        return not any(contains_phrase(t, draft.answer) for t in texts[:-1])

    def golden_answers(self, draft: Draft) -> tuple[str, ...]:
        """The answer plus longer forms ("Vell River") that a supporting passage uses."""
        kind = draft.meta["answer_kind"]
        forms = [f.format(v=draft.answer) for f in _ANSWER_FORMS.get(kind, ())]
        texts = " ".join(self.text[pid] for pid in draft.supporting_ids)
        seen = {normalize_text(draft.answer)}
        extra = [f for f in forms if contains_phrase(texts, f) and normalize_text(f) not in seen]
        return (draft.answer, *extra)


def _sentence(text: str) -> str:
    """Capitalise the first letter (a template may start with a noun phrase)."""
    return text[:1].upper() + text[1:]
