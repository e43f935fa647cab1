"""Errors shared across layers (kept import-free so engines and preflight do not import
each other)."""

from __future__ import annotations


class PreflightError(SystemExit):
    """Raised (as a clean exit with a message, not a traceback) when a run cannot start."""
