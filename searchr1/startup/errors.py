"""The one exception of start-up: a run that cannot start (kept import-free)."""

from __future__ import annotations

import sys


class StartupError(SystemExit):
    """A clean exit with code 2 after one paragraph on stderr (no traceback).

    The paragraph is printed when the error is made, so it reaches the user whichever caller
    lets it end the process (Python prints nothing for an exit with an integer code).
    """

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message
        self.reported = False
        self.report()

    def __str__(self) -> str:
        return self.message

    def report(self) -> None:
        """Print the paragraph to stderr once."""
        if not self.reported:
            print(self.message, file=sys.stderr, flush=True)
            self.reported = True


def exit_with(message: str, kind: type[StartupError] = StartupError):
    """Print ``message`` to stderr and exit with code 2."""
    err = kind(message)
    err.report()
    raise err
