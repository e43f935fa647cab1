"""The package's shape: no import circles and no upward import between its layers, function-local
imports of its own modules only where lazy on purpose (the reason on the line), a small root,
small modules, options findable by name, and cited files that a clone of the tree has."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
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
#: estimators and the losses sit below the loop; the rollout below the loop; the loop below the
#: assembly (build.py hands it what it needs) and beside, never into, the local engine's
#: internals; the engines and the job's data parallelism never import each other (the engine
#: gets the ``DataParallel`` context handed in)
ABOVE = {
    "searchr1.batch": ("searchr1.advantages", "searchr1.loop", "searchr1.engines", "searchr1.rollout",
                       "searchr1.distributed", "searchr1.build", "searchr1.main"),
    "searchr1.advantages": ("searchr1.loop", "searchr1.engines", "searchr1.rollout", "searchr1.build",
                            "searchr1.main"),
    "searchr1.losses": ("searchr1.batch", "searchr1.advantages", "searchr1.loop", "searchr1.engines",
                        "searchr1.rollout", "searchr1.build", "searchr1.main"),
    "searchr1.rollout": ("searchr1.loop", "searchr1.build", "searchr1.main"),
    "searchr1.loop": ("searchr1.build", "searchr1.main", "searchr1.engines.local"),
    "searchr1.engines": ("searchr1.distributed", "searchr1.loop", "searchr1.rollout", "searchr1.advantages",
                         "searchr1.warmstart", "searchr1.build", "searchr1.main"),
    "searchr1.distributed": ("searchr1.engines", "searchr1.loop", "searchr1.build", "searchr1.main"),
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
             "searchr1.lossesque": {"searchr1.loop.update"},
             "searchr1.loop.trainer": {"searchr1.build", "searchr1.engines.base", "searchr1.engines.local.x"},
             "searchr1.rollout.r": {"searchr1.loop.config"},
             "searchr1.engines.local.service": {"searchr1.distributed.launch"},
             "searchr1.distributed.d": {"searchr1.engines.local.sharding.dcp", "searchr1.rollout.scoring"}}
    assert upward_imports(graph) == [("searchr1.advantages.x", "searchr1.loop.train_step"),
                                     ("searchr1.batch.y", "searchr1.engines.base"),
                                     ("searchr1.distributed.d", "searchr1.engines.local.sharding.dcp"),
                                     ("searchr1.engines.local.service", "searchr1.distributed.launch"),
                                     ("searchr1.loop.trainer", "searchr1.build"),
                                     ("searchr1.loop.trainer", "searchr1.engines.local.x"),
                                     ("searchr1.rollout.r", "searchr1.loop.config")]


def test_every_rule_of_the_layering_can_fail():
    planted = {f"{layer}.planted_{i}": {f"{above}.target"} for layer, aboves in ABOVE.items()
               for i, above in enumerate(aboves)}
    assert len(upward_imports(planted)) == sum(map(len, ABOVE.values()))


def test_no_layer_imports_a_layer_above_it():
    """The batch, the estimators, the losses, the rollout and the loop import only downward; the
    engines and the job's data parallelism never import each other."""
    assert upward_imports(import_graph(_modules())) == []


#: a function-local import of the package's own modules names why it is lazy on its line:
#: ``# lazy: <a heavy optional dependency, or start-up time>`` (an import cycle is no reason: fix it)
LAZY_REASON = re.compile(r"#\s*lazy:\s*\S")
NOT_A_REASON = re.compile(r"cycle|circular", re.IGNORECASE)


def unexplained_local_imports(source: str) -> list[int]:
    """Lines of imports of ``searchr1`` inside a function whose statement gives no lazy reason."""
    lines = source.splitlines()
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            own = (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "searchr1" for a in node.names)
                   or isinstance(node, ast.ImportFrom) and node.level == 0
                   and (node.module or "").split(".")[0] == "searchr1")
            if own:
                text = "\n".join(lines[node.lineno - 1:node.end_lineno])
                if not LAZY_REASON.search(text) or NOT_A_REASON.search(text):
                    out.append(node.lineno)
    return sorted(set(out))


def test_the_local_import_finder_finds_planted_ones():
    source = ("import searchr1.a\n\ndef f():\n    from searchr1.b import c\n    import json\n"
              "    from searchr1.d import e  # lazy: torch\n    from searchr1.g import h  # lazy: a cycle\n"
              "    import searchr1.i\n    from searchr1.j import (k,  # lazy: faiss\n        l)\n")
    assert unexplained_local_imports(source) == [4, 7, 8]


def test_every_function_local_import_of_the_package_says_why_it_is_lazy():
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(PKG.rglob("*.py"))
           for n in unexplained_local_imports(p.read_text())]
    assert bad == []


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


def _docs_and_comments(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of a Python file's comments and docstrings."""
    source = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if ast.get_docstring(node, clean=False) is not None:
                for i, line in enumerate(ast.get_docstring(node, clean=False).splitlines()):
                    yield first.lineno + i, line


def _yaml_comments(path: Path) -> Iterator[tuple[int, str]]:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if "#" in line:
            yield i, line[line.index("#"):]


def _all_lines(path: Path) -> Iterator[tuple[int, str]]:
    yield from enumerate(path.read_text().splitlines(), 1)


def cited_sources(root: Path = ROOT) -> Iterator[tuple[Path, int, str]]:
    """(file, line, text) of what a reader is told: the README and the docs, the presets'
    comments, and the comments and docstrings of the package and of the tests."""
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        yield from ((path, i, t) for i, t in _all_lines(path))
    for path in sorted((root / "conf").rglob("*.yaml")):
        yield from ((path, i, t) for i, t in _yaml_comments(path))
    for path in [*sorted((root / "searchr1").rglob("*.py")), *sorted((root / "tests").rglob("*.py"))]:
        if path != Path(__file__).resolve():  # this file's rules cite made-up paths as examples
            yield from ((path, i, t) for i, t in _docs_and_comments(path))


CITED_TEST_PATH = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)\b")
CITED_TEST_NAME = re.compile(r"(?<![\w/.-])(test_\w+\.py)\b")


def cited_tests(text: str) -> list[str]:
    """Test files ``text`` cites: ``tests/…/test_x.py`` paths, and bare ``test_x.py`` names."""
    paths = CITED_TEST_PATH.findall(text)
    names = [n for n in CITED_TEST_NAME.findall(text) if not any(p.endswith(n) for p in paths)]
    return paths + names


def missing_cited_tests(root: Path = ROOT) -> list[str]:
    """``file:line cited`` for every cited test file that is not in ``tests/``."""
    existing = {p.relative_to(root).as_posix() for p in (root / "tests").rglob("*.py")}
    names = {p.rsplit("/", 1)[-1] for p in existing}
    out = []
    for path, i, text in cited_sources(root):
        for cited in cited_tests(text):
            if cited not in (existing if "/" in cited else names):
                out.append(f"{path.relative_to(root)}:{i} {cited}")
    return out


def test_the_citation_finder_finds_paths_and_names():
    line = "see tests/test_paper_fidelity.py, `test_lab_fidelity.py` and tests/loop/test_x.py."
    assert cited_tests(line) == ["tests/test_paper_fidelity.py", "tests/loop/test_x.py",
                                 "test_lab_fidelity.py"]
    assert cited_tests("experiments/x/tests/test_a.py and mytest_b.py") == []


def test_every_cited_test_file_exists():
    assert missing_cited_tests() == []


#: a cited file: folders and a name with a file suffix (``:line`` may follow), or any path that
#: climbs out of its folder (``../x``)
CITED_PATH = re.compile(r"(?<![\w.:/@~$-])((?:\.\./)+[\w./-]*\w|(?:\./)?(?:[\w.<>*-]+/)+[\w<>*-][\w.<>*-]*"
                        r"\.(?:py|md|ya?ml|txt|jsonl?|jinja|sh|toml|sqlite|gz|parquet))(?![\w])")
URL = re.compile(r"\S*\b(?:https?://|[a-z0-9-]+\.(?:com|org|io|co|ai|dev)/)\S*")
#: paths a run writes or a user makes, named as such (not sources, so not in the tree)
RUN_FILES = (".hydra/", "outputs/", "shards/", "eval/", "files/", "conf/local/", ".pg/")
#: another public repository's files: the paper presets cite the official Search-R1 scripts at
#: commit a14dc3a (github.com/PeterGriffinJin/Search-R1) and the verl they vendor
OTHER_REPOSITORIES = ("scripts/nq_hotpotqa/", "verl/", "llm_agent/")
#: a path outside the clone that a reader may have beside it: optional data its tests skip without
BESIDE_THE_CLONE = ("../shared/data/hotpotqa_mini",)


def cited_paths(text: str) -> list[str]:
    """The file paths ``text`` cites (web addresses left out)."""
    return CITED_PATH.findall(URL.sub(" ", text))


def is_in_tree(cited: str, where: Path, root: Path = ROOT) -> bool:
    """Whether ``cited`` (cited in ``where``) names a file of ``root``'s tree: from the root, from
    the package, or from ``where``'s folder or one above it; a pattern (``step_<N>/``, ``*``)
    passes, as do ``RUN_FILES``, ``OTHER_REPOSITORIES`` and ``BESIDE_THE_CLONE``."""
    if any(c in cited for c in "<>*") or cited.startswith(RUN_FILES + OTHER_REPOSITORIES + BESIDE_THE_CLONE):
        return True
    if cited.startswith("../"):
        target = (where.parent / cited).resolve()
        return target.is_relative_to(root.resolve()) and target.exists()
    cited = cited.removeprefix("./")
    bases = [root, root / "searchr1", *(a for a in where.parents if a.is_relative_to(root))]
    return any((base / cited).exists() for base in bases)


def missing_cited_paths(root: Path = ROOT) -> list[str]:
    """``file:line cited`` for every cited file path that a clone of the tree lacks."""
    return [f"{path.relative_to(root)}:{i} {cited}" for path, i, text in cited_sources(root)
            for cited in cited_paths(text) if not is_in_tree(cited, path, root)]


def test_the_path_finder_finds_paths_that_are_not_in_a_clone(tmp_path):
    (tmp_path / "searchr1/loop").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "conf/experiment").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "searchr1/loop/update.py").write_text(
        '"""The update (``loop/update.py``; the lab: ``03-search-r1/train.py``)."""\n'
        "x = 'not/a/comment.py'  # see searchr1/loop/gone.py and update.py:3, https://x.org/a/b.py\n")
    (tmp_path / "conf/experiment/lab.yaml").write_text(
        "# The lab (../shared/seeds/lab.zh.txt), [grpo.sh:40] = scripts/nq_hotpotqa/v0.2/train_grpo.sh\n"
        "a: docs/not_a_comment.md\n")
    (tmp_path / "docs/x.md").write_text("`conf/experiment/lab.yaml`, `.hydra/overrides.yaml`, "
                                        "`eval/step_<N>/summary.json`, huggingface.co/Q/blob/main/config.json\n")
    (tmp_path / "README.md").write_text("see docs/y.md and ../README.md\n")
    assert cited_paths("a/b.py:12, `c/d.yaml`, ../e, 0.9/0.95, x.py") == ["a/b.py", "c/d.yaml", "../e"]
    assert sorted(missing_cited_paths(tmp_path)) == [
        "README.md:1 ../README.md", "README.md:1 docs/y.md", "conf/experiment/lab.yaml:1 ../shared/seeds/lab.zh.txt",
        "searchr1/loop/update.py:1 03-search-r1/train.py", "searchr1/loop/update.py:2 searchr1/loop/gone.py"]


def test_every_cited_path_is_in_the_tree():
    """Docstrings, comments, presets and docs cite only files a user's clone has: not the lab's
    own files (``03-search-r1/…``), a seed text under ``../shared``, or a renamed module."""
    assert missing_cited_paths() == []


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
