"""Rules beside a schema's fields (``searchr1/utils/schema.py``): ranges, choices, a schema's own
checks, and the walker that lists every broken one in the start-up check's words."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from searchr1.utils.registry import Registry, UnknownName
from searchr1.utils.schema import Checked, Range, member, one_of, ranged, schema_problems

PKG = Path(__file__).resolve().parents[2] / "searchr1"
NAMES: Registry = Registry("thing")
NAMES.register("b")(object())
NAMES.register("a")(object())


@dataclass
class Inner:
    window: int = ranged(5, ge=1)


@dataclass
class Outer(Checked):
    rate: float = ranged(0.5, gt=0, le=1)
    top_k: int = ranged(-1, ge=1, off=-1)
    cap: int | None = ranged(None, ge=1, null="no cap")
    kind: str = one_of("a", NAMES)
    split: str = one_of("dev", ("train", "dev", "test"))
    low: int = 1
    high: int = 2
    inner: Inner = field(default_factory=Inner)

    @classmethod
    def problems(cls, node: DictConfig, path: str) -> list[str]:
        return [f"{path}.low > {path}.high"] if node.low > node.high else []


def _problems(**values) -> list[str]:
    root = OmegaConf.create({"outer": OmegaConf.merge(OmegaConf.structured(Outer), values)})
    return schema_problems(root)


def test_defaults_pass_and_each_rule_speaks_the_start_up_checks_words():
    assert _problems() == []
    assert _problems(rate=0, top_k=0, cap=0, kind="c", split="val", low=3, inner={"window": 0}) == [
        "outer.rate=0.0 must be in (0, 1]",
        "outer.top_k=0 must be -1 (off) or >= 1",
        "outer.cap=0 must be null (no cap) or >= 1",
        "outer.kind='c' is unknown (valid: a, b)",  # a registry's names, sorted
        "outer.split='val' is unknown (valid: train, dev, test)",  # a tuple keeps its order
        "outer.low > outer.high",  # the schema's own check, then the nodes below it
        "outer.inner.window=0 must be >= 1",
    ]


def test_ranges_refuse_what_is_not_finite_and_pass_null():
    assert Range(ge=0).problem(float("nan")) == "must be >= 0"
    assert Range(gt=0, lt=1).problem(1.0) == "must be in (0, 1)"
    assert Range(ge=1).problem(None) is None and Range(ge=1).problem(True) is None


class Colour(str, Enum):
    red = "red"
    blue = "blue"


def test_member_names_the_valid_values():
    assert member(Colour, "red", "x.colour") is Colour.red is member(Colour, Colour.red, "x.colour")
    with pytest.raises(ValueError, match=r"x.colour='green' is unknown \(valid: red, blue\)"):
        member(Colour, "green", "x.colour")


def test_an_unknown_registered_name_is_a_key_error_and_a_value_error():
    with pytest.raises(KeyError):
        NAMES.get("c")
    with pytest.raises(ValueError, match="unknown thing 'c'; valid: a, b"):
        NAMES.get("c")
    assert issubclass(UnknownName, KeyError) and issubclass(UnknownName, ValueError)


def test_no_shared_code_branches_on_the_lab_option():
    """The lab's rules are registered options its preset selects (DESIGN.md, "Variants as
    options"): no comparison with the name "lab" anywhere in the package."""
    branch = re.compile(r"""(==|!=|\bin)\s*\(?["']lab["']|["']lab["']\s*(==|!=)""")
    found = [f"{p.relative_to(PKG)}:{n}" for p in PKG.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if branch.search(line)]
    assert found == []
