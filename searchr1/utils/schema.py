"""Rules that live beside a schema's fields: number ranges and named choices.

A config schema states what a field accepts where it declares the field::

    group_size: int = ranged(4, ge=1)  # trajectories per question
    top_p: float = ranged(1.0, gt=0, le=1)
    data_order: str = one_of("epochs", DATA_ORDERS)  # a registry: its names are the choices

Hydra sees an ordinary default (the rule rides in the dataclass field's ``metadata``), so
composing is unchanged. ``schema_problems(cfg)`` walks a composed config, finds every node's
schema (``OmegaConf.get_type``), and returns one line per value that breaks its field's rule
(``rollout.top_p=1.5 must be in (0, 1]``, ``eval.selection='x' is unknown (valid: …)``); the
start-up check (``startup/checks.py``) lists them with every other problem before any work.
A schema with rules beyond single fields (two fields that constrain each other, a file a field
names) subclasses ``Checked`` and returns those problems from ``problems``.

Choices that select behaviour are registries (``utils/registry.py``), so ``one_of`` reads the
valid names when it checks, after every option has registered. Closed choices with no code
behind them are enums in the schema and fail at compose instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from searchr1.utils.registry import Registry

RULE = "searchr1.rule"  # the metadata key of a field's rule
E = TypeVar("E", bound=Enum)


@dataclass(frozen=True)
class Range:
    """A number's allowed interval; ``off`` is one more value that turns the setting off, and
    ``null`` (when set) says in the message what a null value means. Null always passes."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    off: int | None = None
    null: str | None = None

    def holds(self, v: float) -> bool:
        return (math.isfinite(v) and (self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))

    def describe(self) -> str:
        lo = self.gt if self.gt is not None else self.ge
        hi = self.lt if self.lt is not None else self.le
        if lo is not None and hi is not None:
            text = f"in {'(' if self.gt is not None else '['}{lo}, {hi}{')' if self.lt is not None else ']'}"
        elif lo is not None:
            text = f"> {lo}" if self.gt is not None else f">= {lo}"
        else:
            text = f"< {hi}" if self.lt is not None else f"<= {hi}"
        if self.off is not None:
            text = f"{self.off} (off) or {text}"
        if self.null is not None:
            text = f"null ({self.null}) or {text}"
        return f"must be {text}"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value == self.off:
            return None
        return None if self.holds(value) else self.describe()


@dataclass(frozen=True)
class Choice:
    """A string that must name one of ``options`` (a registry's names, or a fixed tuple)."""

    options: Registry | tuple[str, ...]

    def valid(self) -> list[str]:
        return self.options.names() if isinstance(self.options, Registry) else list(self.options)

    def problem(self, value: Any) -> str | None:
        if value is None or value in self.valid():
            return None
        return f"is unknown (valid: {', '.join(self.valid())})"


def ranged(default: Any, **bounds: Any) -> Any:
    """A field defaulting to ``default`` whose value must satisfy ``Range(**bounds)``."""
    return dataclasses.field(default=default, metadata={RULE: Range(**bounds)})


def one_of(default: str | None, options: Registry | tuple[str, ...]) -> Any:
    """A string field defaulting to ``default`` whose value must name one of ``options``."""
    return dataclasses.field(default=default, metadata={RULE: Choice(options)})


class Checked:
    """A schema with rules beyond its fields' own (``ranged`` / ``one_of``)."""

    @classmethod
    def problems(cls, node: DictConfig, path: str) -> list[str]:
        """What is wrong with ``node`` (this schema's composed node at ``path``) beyond its
        fields' own rules; empty when nothing is."""
        return []


def member(kind: type[E], given: object, path: str) -> E:
    """``given`` (a member or its value) as a member of ``kind``; a ValueError naming the valid
    values otherwise. Hydra checks an enum field at compose; this covers a schema built in Python."""
    try:
        return kind(given)
    except ValueError:
        valid = ", ".join(str(m.value) for m in kind)
        raise ValueError(f"{path}={given!r} is unknown (valid: {valid})") from None


def field_value(node: Any, key: str) -> Any:
    """``node.key``, or None when the node lacks it or it is ``???`` (missing)."""
    if not isinstance(node, DictConfig) or key not in node or OmegaConf.is_missing(node, key):
        return None
    return node[key]


def _nodes(node: DictConfig, path: str) -> Iterator[tuple[str, DictConfig]]:
    """``(dotted path, node)`` for ``node`` and every config node below it."""
    yield path, node
    for key in node:
        child = field_value(node, str(key))
        if isinstance(child, DictConfig):
            yield from _nodes(child, f"{path}.{key}" if path else str(key))


def field_rules(schema: type) -> dict[str, Any]:
    """Field name → rule for ``schema``'s fields that carry one."""
    return {f.name: f.metadata[RULE] for f in dataclasses.fields(schema) if RULE in f.metadata}


def schema_problems(cfg: DictConfig) -> list[str]:
    """Every value of ``cfg`` that breaks its schema field's rule, and every ``Checked``
    schema's own problems."""
    out: list[str] = []
    for path, node in _nodes(cfg, ""):
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            continue
        for key, rule in field_rules(schema).items():
            v = field_value(node, key)
            problem = rule.problem(v)
            if problem:
                shown = repr(v) if isinstance(rule, Choice) else v
                out.append(f"{path}.{key}={shown} {problem}" if path else f"{key}={shown} {problem}")
        if issubclass(schema, Checked):
            out += schema.problems(node, path)
    return out
