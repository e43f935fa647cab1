"""Interaction protocols (``protocol.name``): importing this package registers them all."""

from searchr1.protocols.base import PROTOCOLS
from searchr1.protocols import tags  # noqa: F401  (registers "tags")

try:  # the lab protocol; its module only needs transformers, always installed
    from searchr1.protocols import tool_call  # noqa: F401
except ImportError:  # pragma: no cover
    pass

__all__ = ["PROTOCOLS"]
