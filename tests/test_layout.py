"""The package's shape: no import circles, a small root, small modules, options findable by name."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "searchr1"
MAX_LINES = 400
ROOT_MODULES = {"__init__.py", "main.py", "build.py", "config.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the package modules it imports (at any depth of the file, not TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_planted_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_circles():
    assert cycles(import_graph(_modules())) == []


def test_the_engine_never_imports_the_loop():
    graph = import_graph(_modules())
    bad = [(m, t) for m, ts in graph.items() if m.startswith("searchr1.engines")
           for t in ts if t.startswith(("searchr1.loop", "searchr1.startup", "searchr1.build"))
           and t != "searchr1.startup.errors"]  # the one import-free exception type
    assert bad == []


#: a layer → the packages above it, which it must never import (outside TYPE_CHECKING): the
#: step batch sits below the estimators, the critic's algorithm half and the loop; the
#: estimators and the losses sit below the loop
ABOVE = {
    "searchr1.batch": ("searchr1.advantages", "searchr1.loop", "searchr1.engines", "searchr1.rollout",
                       "searchr1.distributed", "searchr1.build", "searchr1.main"),
    "searchr1.advantages": ("searchr1.loop", "searchr1.engines", "searchr1.rollout", "searchr1.build",
                            "searchr1.main"),
    "searchr1.losses": ("searchr1.batch", "searchr1.advantages", "searchr1.loop", "searchr1.engines",
                        "searchr1.rollout", "searchr1.build", "searchr1.main"),
}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, target) for every import of a layer in ``ABOVE`` into a package above it."""
    return sorted((m, t) for m, ts in graph.items() for layer, above in ABOVE.items() if _within(m, layer)
                  for t in ts if any(_within(t, a) for a in above))


def test_the_upward_import_finder_finds_a_planted_one():
    graph = {"searchr1.advantages.x": {"searchr1.loop.train_step", "searchr1.batch.step_batch"},
             "searchr1.batch.y": {"searchr1.engines.base"}, "searchr1.loop.z": {"searchr1.batch.step_batch"},
             "searchr1.lossesque": {"searchr1.loop.update"}}
    assert upward_imports(graph) == [("searchr1.advantages.x", "searchr1.loop.train_step"),
                                     ("searchr1.batch.y", "searchr1.engines.base")]


def test_the_step_batch_the_estimators_and_the_losses_never_import_upward():
    assert upward_imports(import_graph(_modules())) == []


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(n for n in _modules() if not n.endswith("__main__"))
    code = ("import importlib, sys\nbad = []\nfor n in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(n)\n"
            "    except Exception as e:\n        bad.append(f'{n}: {e!r}')\n"
            "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_root_holds_only_the_entry_point_assembly_and_schema():
    assert {p.name for p in PKG.glob("*.py")} == ROOT_MODULES


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_is_longer_than_the_limit(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


REGISTERED_GROUPS = ("engine", "data", "retriever", "protocol", "reward", "loss", "advantage")


def test_every_option_is_found_by_its_config_name():
    source = "\n".join(p.read_text() for p in PKG.rglob("*.py"))
    missing = []
    for group in REGISTERED_GROUPS:
        for yaml in (ROOT / "conf" / group).glob("*.yaml"):
            if not re.search(rf'register\("{re.escape(yaml.stem)}"[,)]', source):
                missing.append(f"{group}={yaml.stem}")
    assert missing == []


def test_no_comment_cites_an_issue_number_or_a_design_file():
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in PKG.rglob("*.py")
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"\bissue \d+|\bDESIGN\b", line)]
    assert bad == []


CITED_TEST_PATH = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)\b")
CITED_TEST_NAME = re.compile(r"(?<![\w/.-])(test_\w+\.py)\b")


def cited_tests(text: str) -> list[str]:
    """Test files ``text`` cites: ``tests/…/test_x.py`` paths, and bare ``test_x.py`` names."""
    paths = CITED_TEST_PATH.findall(text)
    names = [n for n in CITED_TEST_NAME.findall(text) if not any(p.endswith(n) for p in paths)]
    return paths + names


def missing_cited_tests() -> list[str]:
    """``file:line cited`` for every cited test file that is not in ``tests/``: in the docs,
    the config tree, the README and the package's docstrings and comments."""
    existing = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py")}
    names = {p.rsplit("/", 1)[-1] for p in existing}
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
               *sorted((ROOT / "conf").rglob("*.yaml")), *sorted(PKG.rglob("*.py"))]
    out = []
    for path in sources:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for cited in cited_tests(line):
                known = existing if "/" in cited else names
                if cited not in known:
                    out.append(f"{path.relative_to(ROOT)}:{i} {cited}")
    return out


def test_the_citation_finder_finds_paths_and_names():
    line = "see tests/test_paper_fidelity.py, `test_lab_fidelity.py` and tests/loop/test_x.py."
    assert cited_tests(line) == ["tests/test_paper_fidelity.py", "tests/loop/test_x.py",
                                 "test_lab_fidelity.py"]
    assert cited_tests("experiments/x/tests/test_a.py and mytest_b.py") == []


def test_every_cited_test_file_exists():
    assert missing_cited_tests() == []


def test_the_test_hooks_are_the_crash_points_that_faults_py_names():
    """Test hooks in the package are ``crash_point`` calls only, each named in ``POINTS``."""
    from searchr1.utils.faults import POINTS

    used = set()
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Name) and a.id == "crash_point" for a in [node.func, *node.args]):
                name = next(a for a in node.args if isinstance(a, ast.Constant))
                used.add(name.value)
    assert used == set(POINTS)
