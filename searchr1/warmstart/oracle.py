"""Oracle trajectories: what a perfect searcher would write, rendered token-exactly.

For each world question the oracle walks its hops (``QAExample.oracle_queries`` with the
passage each must retrieve, ``supporting_ids``), searching with the CONFIGURED retriever and
rendering every observation with the CONFIGURED protocol, so a trajectory's tokens are
exactly those a rollout would hold had the policy sampled the oracle's text: each assistant
turn's text is tokenised as the "sampled" tokens (mask 1; for chat templates followed by the
end-of-turn token the sampler stops on), then ``protocol.observation_tokens`` (mask 0).

Diversity (shares in ``warmstart.mix``): each hop draws a phrasing (name only, name +
relation words, question-like); in a share of trajectories (``fail_first``) the question
verbatim is searched at the first hop it does not answer (usually the second of a chain),
and any search whose shown passages miss the needed one is followed by a "missed" line and
the next phrasing, within the rollout's search budget; reasoning lines are drawn from small pools.

Departures: a hop counts as found only when the needed passage survives the observation's
token budget (what the model would actually see); questions needing more searches than
``rollout.max_searches`` (or turns than ``rollout.max_turns``) are skipped, not truncated.
Answering without search applies only to examples marked ``meta["knowable"]``: none in the
generated world, whose answers exist only in its corpus.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from searchr1.data.types import Passage, QAExample
from searchr1.protocols.base import Action, ActionKind, Observation, Protocol
from searchr1.retrievers.base import Document, Retriever
from searchr1.rollout.types import Trajectory, Turn
from searchr1.warmstart import phrasing as ph
from searchr1.warmstart.config import MixConfig

NO_ORACLE = ("warmstart needs oracle queries, which only generated data has (data=world); "
             "data source {source!r} has none — use warmstart=none, or warmstart.init_from=<path>")


class OracleError(ValueError):
    """An oracle turn does not parse back to its intended action (a bug), or no oracle data."""


@dataclass(frozen=True)
class Hop:
    """One search the oracle must make: the generator's query, the passage, its title."""

    query: str
    passage_id: str
    title: str


@dataclass
class OracleStats:
    """Counters of one ``render_many`` call."""

    rendered: int = 0
    skipped_budget: int = 0  # needs more searches / turns / tokens than the rollout allows
    skipped_unreachable: int = 0  # no phrasing retrieved a needed passage
    failed_searches: int = 0  # in rendered trajectories
    searches: int = 0  # in rendered trajectories
    phrasings: dict[str, int] = field(default_factory=dict)  # over all search attempts kept


class TurnWriter:
    """Assistant-turn text for one protocol: thinking slot + action, as the parser expects."""

    def __init__(self, protocol: Protocol) -> None:
        self.tags = protocol.__class__.__name__ == "TagsProtocol"
        template = getattr(protocol, "chat_template", "") or ""
        self.xml_calls = "<function=" in template
        self.end_tokens: list[int] = [] if self.tags else [int(protocol.stop[0])]

    def search(self, reasoning: str, query: str) -> str:
        if self.tags:
            return f"<think> {reasoning} </think>\n<search> {query} </search>"
        if self.xml_calls:
            call = f"<function=search>\n<parameter=query>\n{query}\n</parameter>\n</function>"
        else:
            call = json.dumps({"name": "search", "arguments": {"query": query}}, ensure_ascii=False)
        return f"{reasoning}\n<tool_call>\n{call}\n</tool_call>".lstrip("\n")

    def answer(self, reasoning: str, answer: str) -> str:
        if self.tags:
            return f"<think> {reasoning} </think>\n<answer> {answer} </answer>"
        return f"{reasoning}\nAnswer: {answer}".lstrip("\n")


class OracleRenderer:
    """Renders oracle trajectories for one protocol, retriever and rollout budget."""

    def __init__(self, protocol: Protocol, retriever: Retriever, topk: int, rollout_cfg,
                 corpus: list[Passage] | None, mix: MixConfig) -> None:
        self.protocol, self.retriever, self.topk = protocol, retriever, topk
        self.tokenizer = protocol.tokenizer
        self.cfg, self.mix = rollout_cfg, mix
        self.titles = {p.id: p.title for p in corpus or []}
        self.writer = TurnWriter(protocol)
        self.shares = {"name_only": mix.name_only, "relation": mix.relation,
                       "question": mix.question}
        self.stats = OracleStats()

    def hops(self, example: QAExample) -> list[Hop]:
        """The example's searches in order; raises when it has no oracle data."""
        if not example.oracle_queries:
            raise OracleError(NO_ORACLE.format(source=example.data_source))
        return [Hop(q, pid, self.titles.get(pid, ""))
                for q, pid in zip(example.oracle_queries, example.supporting_ids)]

    async def render_many(self, examples: list[QAExample], count: int,
                          seed: int) -> list[Trajectory]:
        """``count`` trajectories cycling over ``examples`` (new draws on every pass)."""
        if examples and not any(ex.oracle_queries for ex in examples):
            raise OracleError(NO_ORACLE.format(source=examples[0].data_source))
        out: list[Trajectory] = []
        bar = tqdm(total=count, desc="oracle trajectories", unit="traj", leave=False)
        for k in range(max(1, 4 * count)):  # each pass redraws; unreachable ones are skipped
            if len(out) >= count or not examples:
                break
            ex = examples[k % len(examples)]
            traj = await self.render(ex, random.Random(f"warmstart:{seed}:{ex.id}:{k}"))
            if traj is not None:
                out.append(traj)
                bar.update(1)
        bar.close()
        return out

    async def render(self, example: QAExample, rng: random.Random) -> Trajectory | None:
        """One oracle trajectory for ``example``, or None when it cannot fit the budget."""
        plan = self.hops(example)
        spare = min(self.cfg.max_searches, self.cfg.max_turns - 1) - len(plan)
        if spare < 0:
            self.stats.skipped_budget += 1
            return None
        traj = Trajectory.start(example, 0, self.protocol.example_prompt(example))
        if example.meta.get("knowable") and rng.random() < self.mix.no_search:
            return self._finish(traj, ph.say(rng, ph.DIRECT), example)
        fails_left = min(spare, self.mix.max_failed_searches)
        reason = ph.say(rng, ph.START, focus=plan[0].title if plan[0].title in plan[0].query
                        else "it")
        fail_hop = await self._first_miss(example.question, plan) \
            if rng.random() < self.mix.fail_first else None
        for i, hop in enumerate(plan):
            verbatim = example.question if i == fail_hop else None
            fails_left, found = await self._hop(traj, hop, verbatim, reason, fails_left, rng)
            if not found:
                self.stats.skipped_unreachable += 1
                return None
            if i + 1 < len(plan):
                reason = ph.say(rng, ph.FOUND, focus=hop.title, next=plan[i + 1].title)
        lines = ph.COMPARE if example.data_source.endswith("compare") else ph.ANSWER
        return self._finish(traj, ph.say(rng, lines, answer=example.golden_answers[0]), example)

    async def _first_miss(self, question: str, plan: list[Hop]) -> int | None:
        """The first hop whose passage a search for the question verbatim does not return."""
        docs = (await self.retriever.search([question], self.topk))[0]
        ids = {d.id for d in docs}
        return next((i for i, hop in enumerate(plan) if hop.passage_id not in ids), None)

    async def _hop(self, traj: Trajectory, hop: Hop, verbatim: str | None, reason: str,
                   fails_left: int, rng: random.Random) -> tuple[int, bool]:
        """Search candidates until one shows ``hop``'s passage; failures kept while allowed.

        ``verbatim`` (the question itself, known to miss this hop) is tried first."""
        variants = ph.query_variants(hop.query, hop.title)
        first = ph.pick_phrasing(rng, self.shares, list(variants))
        candidates = ([verbatim] if verbatim else []) + ph.ordered_candidates(variants, first)
        for n, query in enumerate(candidates):
            turn = self._turn(self.writer.search(reason, query), ActionKind.SEARCH, query)
            if turn is None:
                continue
            docs = (await self.retriever.search([query], self.topk))[0]
            tokens, text = self.protocol.observation_tokens(
                turn.sampled_tokens, Observation(documents=tuple(docs)),
                self.cfg.max_observation_tokens)
            found = _shows(text, docs, hop.passage_id)
            if found or fails_left > 0:
                self._commit(traj, turn, tokens, text, docs)
                self.stats.phrasings[first if n == 0 else "retry"] = (
                    self.stats.phrasings.get(first if n == 0 else "retry", 0) + 1)
                if found:
                    return fails_left, True
                fails_left -= 1
                reason = ph.say(rng, ph.MISSED)
        return fails_left, False

    def _finish(self, traj: Trajectory, reason: str, example: QAExample) -> Trajectory | None:
        answer = example.golden_answers[0]
        turn = self._turn(self.writer.answer(reason, answer), ActionKind.ANSWER, answer)
        if turn is None or len(traj.tokens_T) + len(turn.sampled_tokens) > \
                self.cfg.max_trajectory_tokens:
            self.stats.skipped_budget += 1
            return None
        self._commit(traj, turn, [], "", [])
        traj.answer = answer
        searches = sum(t.action.kind is ActionKind.SEARCH for t in traj.turns)
        self.stats.rendered += 1
        self.stats.searches += searches
        self.stats.failed_searches += max(0, searches - len(example.oracle_queries))
        return traj

    def _turn(self, text: str, kind: ActionKind, value: str) -> Turn | None:
        """Tokenise one turn (end-of-turn token appended) and check it parses as intended."""
        tokens = list(self.tokenizer.encode(text, add_special_tokens=False))
        tokens += self.writer.end_tokens
        if len(tokens) > self.cfg.max_turn_tokens:
            return None
        decoded = self.tokenizer.decode(tokens, skip_special_tokens=False,
                                        clean_up_tokenization_spaces=False)
        action = self.protocol.parse_action(decoded)
        expected = (action.query if kind is ActionKind.SEARCH else action.answer)
        if action.kind is not kind or expected != value.strip():
            raise OracleError(f"oracle turn parses as {action} instead of {kind.value} "
                              f"{value!r}: {decoded!r}")
        return Turn(0, tokens, [0.0] * len(tokens), decoded, "stop", action)

    def _commit(self, traj: Trajectory, turn: Turn, obs_tokens: list[int], obs_text: str,
                docs: list[Document]) -> None:
        turn.prompt_len = len(traj.tokens_T)
        traj.append_sampled(turn.sampled_tokens, turn.sampled_logprobs)
        traj.append_observation(obs_tokens)
        turn.observation_text, turn.observation_len = obs_text, len(obs_tokens)
        turn.documents = list(docs)
        traj.turns.append(turn)


def _shows(observation_text: str, docs: list[Document], passage_id: str) -> bool:
    """Whether the needed passage is among ``docs`` and survived the observation budget."""
    return any(d.id == passage_id and d.text[:60] in observation_text for d in docs)


__all__ = ["Action", "Hop", "OracleError", "OracleRenderer", "OracleStats", "TurnWriter"]
