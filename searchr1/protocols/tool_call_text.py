"""The texts of ``protocol=tool_call``: the tool schema, the prompts, the observation format.

Every string the model reads in the lab's protocol is built here or in
``observation_text.py`` (the observation texts); ``tool_call.py`` renders them through the
chat template. The defaults are our own wording. A user who wants the
lab's exact texts supplies them as options (``protocol.system_prompt_file``,
``protocol.tool_description``, ``protocol.query_description``, ``protocol.question_template``,
``protocol.observation_template_file``); nothing here is copied from the lab.
"""

from __future__ import annotations

from dataclasses import asdict
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any

from searchr1.protocols.observation_text import DEFAULT_TEXTS, load_observation_texts
from searchr1.retrievers.base import Document

TOOL_DESCRIPTION = (
    "Search for evidence. Returns the top results, each with its title, content, source and URL."
)
QUERY_DESCRIPTION = "A concise search query."


def search_tool(description: str = TOOL_DESCRIPTION,
                query_description: str = QUERY_DESCRIPTION) -> dict[str, Any]:
    """The one tool's JSON schema, ``search(query: string)``: the tool's ``description`` and
    its one parameter's ``query_description``."""
    return {
        "type": "function",
        "function": {
            "name": "search",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": query_description}
                },
                "required": ["query"],
            },
        },
    }


SEARCH_TOOL: dict[str, Any] = search_tool()
QUESTION_SLOT = "{question}"
USER_PROMPT = (
    "Answer the question below. Use the `search` tool when you need evidence: call it with "
    "one concise query per turn and wait for its results; you may search several times. "
    "When you are ready, finish with a final line in exactly this format:\n"
    "Answer: <short answer>\n"
    "Do not call the tool in the turn that gives the answer.\n\n"
    "Question: {question}"
)
# our observation texts (templates/observation.yaml; protocol.observation_template_file)
INVALID_MESSAGE = DEFAULT_TEXTS.invalid
NO_RESULTS = DEFAULT_TEXTS.no_results


class OverflowRule(str, Enum):
    """An observation over ``rollout.max_observation_tokens`` (``protocol.on_observation_overflow``)."""

    cut = "cut"  # drop whole results, last first, then cut the last one to fit
    end = "end"  # whole results only; the trajectory ends when not even the first fits (the lab)


def load_template(name_or_path: str, suffix: str = ".jinja") -> str:
    """A bundled ``templates/<name><suffix>`` by name, or a ``<suffix>`` file by path."""
    path = Path(name_or_path)
    if path.suffix == suffix and path.is_file():
        return path.read_text()
    bundled = resources.files("searchr1.protocols") / "templates" / f"{name_or_path}{suffix}"
    if not bundled.is_file():
        what = "chat template" if suffix == ".jinja" else "prompt text"
        raise FileNotFoundError(f"no {what} {name_or_path!r} (bundled or as a {suffix} path)")
    return bundled.read_text()


def system_text(cfg) -> str | None:
    """The system message of ``cfg``: inline, from a file, or None (both set is an error)."""
    if cfg.system_prompt is not None and cfg.system_prompt_file is not None:
        raise ValueError("set protocol.system_prompt or protocol.system_prompt_file, not both")
    if cfg.system_prompt_file is not None:
        return load_template(cfg.system_prompt_file, ".txt").strip()
    return cfg.system_prompt


def format_documents(docs: list[Document], max_chars: int) -> str:
    """Observation text in our default layout (``DEFAULT_TEXTS.documents``)."""
    return DEFAULT_TEXTS.documents(docs, max_chars)


def prompt_texts(cfg) -> dict[str, object]:
    """Every text ``protocol=tool_call`` shows the model (what a warm start's fingerprint covers)."""
    return {"system": system_text(cfg),
            "user": USER_PROMPT if cfg.question_template is None else cfg.question_template,
            "tool": TOOL_DESCRIPTION if cfg.tool_description is None else cfg.tool_description,
            "query": QUERY_DESCRIPTION if cfg.query_description is None else cfg.query_description,
            "observation": asdict(load_observation_texts(
                getattr(cfg, "observation_template_file", None))),
            "template": cfg.fallback_template}
