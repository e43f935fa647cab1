"""The texts of a ``protocol=tool_call`` observation (``protocol.observation_template_file``).

An observation is one of: the search results (each result's lines from ``result``, results
joined by ``separator``), ``no_results``, ``error`` (a failed search) or ``invalid`` (the
reply to a malformed turn). The bundled ``templates/observation.yaml`` holds our wording and
is the default; a user's ``.yaml`` file of the same shape replaces any of its keys, so the
layout another codebase shows its model (indentation, field names, error texts) is one file
away without code. Fields: ``{index}``, ``{title}``, ``{content}``, ``{source}``, ``{url}``
in result lines, ``{error}`` in ``error``; a result line that uses a field listed in
``optional`` is left out when that field is empty. ``{source}`` is itself written by the
``source`` pieces, joined, a piece whose field is empty left out: ``{label}`` (the retriever's
own source label; ours for zhihu is ``zhihu/<content type> / <author>``), ``{kind}`` (the
content type the search service reports, ``no_kind`` when it reports none) and ``{author}``.
So both ``zhihu/answer / Alice`` and ``answer / Alice`` are one template away. Unknown keys
or fields fail at start-up.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import yaml

from searchr1.retrievers.base import Document

DEFAULT_TEMPLATE = "observation"
RESULT_FIELDS = ("index", "title", "content", "source", "url")
SOURCE_FIELDS = ("label", "kind", "author")
LIST_KEYS = ("result", "optional", "source")


@dataclass(frozen=True)
class ObservationTexts:
    """Every observation text ``protocol=tool_call`` shows the model."""

    result: tuple[str, ...]
    optional: tuple[str, ...]
    source: tuple[str, ...]
    no_kind: str
    separator: str
    untitled: str
    no_results: str
    error: str
    invalid: str

    def result_block(self, index: int, doc: Document, max_chars: int) -> str:
        """One result's lines; ``doc.text`` cut to ``max_chars`` characters."""
        values = {"index": str(index), "title": doc.title or self.untitled,
                  "content": doc.text[:max_chars], "source": self.source_text(doc),
                  "url": doc.url or ""}
        lines = [line for line in self.result
                 if not any(f in self.optional and not values[f] for f in _names(line))]
        return "\n".join(line.format_map(values) for line in lines)

    def source_text(self, doc: Document) -> str:
        """``{source}`` of ``doc``: the ``source`` pieces joined, those with an empty field left out."""
        values = {"label": doc.source or "", "kind": doc.kind or self.no_kind,
                  "author": doc.author or ""}
        return "".join(piece.format_map(values) for piece in self.source
                       if all(values[f] for f in _names(piece)))

    def result_blocks(self, docs: list[Document], max_chars: int) -> list[str]:
        """Each result's block, numbered from 1."""
        return [self.result_block(i, d, max_chars) for i, d in enumerate(docs, 1)]

    def documents(self, docs: list[Document], max_chars: int) -> str:
        """The observation for ``docs``: the blocks joined, or ``no_results`` when empty."""
        return self.separator.join(self.result_blocks(docs, max_chars)) or self.no_results

    def failure(self, error: str) -> str:
        """The observation for a failed search."""
        return self.error.format_map({"error": error})


def _names(text: str) -> list[str]:
    """The ``{field}`` names used in ``text``."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _read(name_or_path: str) -> dict:
    """The mapping in a bundled ``templates/<name>.yaml`` or in a ``.yaml`` file by path."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    else:
        bundled = resources.files("searchr1.protocols") / "templates" / f"{name_or_path}.yaml"
        if not bundled.is_file():
            raise FileNotFoundError(
                f"protocol.observation_template_file={name_or_path!r}: no such bundled template "
                f"or .yaml file")
        text = bundled.read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"protocol.observation_template_file={name_or_path!r}: not valid "
                         f"YAML ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"protocol.observation_template_file={name_or_path!r}: not a mapping")
    return data


def _check(data: dict, where: str) -> None:
    """Unknown keys, a non-list ``result`` or unknown ``{fields}`` are errors."""
    known = {f.name for f in fields(ObservationTexts)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (valid: {sorted(known)})")
    for key in LIST_KEYS:
        if key in data and not isinstance(data[key], list):
            raise ValueError(f"{where}: `{key}` must be a list")
    allowed = {"error": ("error",), "result": RESULT_FIELDS, "optional": (),
               "source": SOURCE_FIELDS}
    for key, value in data.items():
        texts = value if isinstance(value, list) else [value]
        if key == "optional":
            bad = [v for v in texts if v not in RESULT_FIELDS]
        else:
            bad = [n for t in texts for n in _names(str(t)) if n not in allowed.get(key, ())]
        if bad:
            raise ValueError(f"{where}: `{key}` uses unknown fields {bad}")


def load_observation_texts(name_or_path: str | None = None) -> ObservationTexts:
    """The bundled defaults, with the keys of ``name_or_path`` (bundled name or path) on top."""
    base = _read(DEFAULT_TEMPLATE)
    chosen = name_or_path or DEFAULT_TEMPLATE
    data = {} if chosen == DEFAULT_TEMPLATE else _read(chosen)
    _check(data, f"protocol.observation_template_file={chosen!r}")
    merged = {**base, **data}
    return ObservationTexts(**{k: tuple(str(x) for x in v) if k in LIST_KEYS else str(v)
                               for k, v in merged.items()})


DEFAULT_TEXTS = load_observation_texts()
