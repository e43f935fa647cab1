"""The paper's cut rule (``protocol.cut=official``), applied to the sampled tokens.

Search-R1's rollout (``llm_agent/generation.py``) sets no stop strings: each turn runs to
EOS or the token limit, is decoded with special tokens skipped, and the decoded string is
cut after the first ``</search>`` anywhere in it, else after the first ``</answer>``, else
kept whole. The EOS is therefore never part of a response, and text after the first
closing tag (often a hallucinated ``<information>`` block) is thrown away.

The official code then re-tokenises the cut string. Here the cut is made on the sampled
tokens instead, so the trajectory holds exactly the tokens (and logprobs) the sampler
produced, in the order it produced them:

- with a tag, the kept tokens are the shortest prefix whose decoded text contains the tag.
  When the tag ends inside a token (a BPE merge such as ``>\\n\\n`` or ``>.``), that token
  is kept whole: the context then carries the few characters after the tag that the model
  really sampled, while the turn's text is the official string, cut exactly at the tag
  (used for parsing and scoring, as the official reward reads it);
- without a tag, trailing special tokens (EOS, end-of-turn) are dropped, as decoding with
  ``skip_special_tokens`` drops them officially; a special token in the middle of a turn
  stays (the official string loses it, but dropping it from the tokens would change the
  context the model already conditioned on).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

#: the closing tags that end a turn, in the official order of precedence
CUT_TAGS = ("</search>", "</answer>")


@dataclass(frozen=True)
class CutTurn:
    """One assistant turn after the cut: kept tokens, their logprobs, the official text."""

    tokens: list[int]
    logprobs: list[float]
    text: str


def official_cut_text(text: str) -> tuple[str, str | None]:
    """(cut text, tag): the official string rule; tag None when neither tag occurs."""
    for tag in CUT_TAGS:
        at = text.find(tag)
        if at >= 0:
            return text[: at + len(tag)], tag
    return text, None


def shortest_prefix_with(tokens: list[int], tag: str, decode: Callable[[list[int]], str]) -> int:
    """Length of the shortest token prefix whose decoded text contains ``tag``.

    Containment is monotone in the prefix length (decoding more tokens never removes text
    already decoded), so a binary search needs O(log n) decodes. Raises when even the whole
    sequence does not contain the tag.
    """
    if tag not in decode(tokens):
        raise ValueError(f"{tag!r} does not occur in the decoded tokens")
    lo, hi = 1, len(tokens)  # invariant: decode(tokens[:hi]) contains the tag
    while lo < hi:
        mid = (lo + hi) // 2
        if tag in decode(tokens[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return hi


def strip_trailing(tokens: list[int], drop: Collection[int]) -> int:
    """Length of ``tokens`` without its trailing run of ids in ``drop``."""
    keep = len(tokens)
    while keep and tokens[keep - 1] in drop:
        keep -= 1
    return keep


def cut_sampled_turn(
    tokens: list[int],
    logprobs: list[float],
    decode: Callable[[list[int]], str],
    special_ids: Collection[int],
) -> CutTurn:
    """Apply the official cut to one sampled turn (``decode`` skips special tokens)."""
    if len(tokens) != len(logprobs):
        raise ValueError(f"{len(tokens)} sampled tokens but {len(logprobs)} logprobs")
    text, tag = official_cut_text(decode(tokens))
    if tag is None:
        keep = strip_trailing(tokens, special_ids)
    else:
        keep = shortest_prefix_with(tokens, tag, decode)
    return CutTurn(list(tokens[:keep]), [float(x) for x in logprobs[:keep]], text)
