"""Interaction protocols (``protocol.name``): importing this package registers them all."""

from searchr1.protocols.base import PROTOCOLS
from searchr1.protocols import tags, tool_call  # noqa: F401  (register "tags", "tool_call")

__all__ = ["PROTOCOLS"]
