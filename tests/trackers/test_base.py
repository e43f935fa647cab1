"""A run that stops cleanly is finished with its own exit code and reason, not "failed (1)"."""

from __future__ import annotations

import errno

import pytest

from searchr1.loop.breaker import SearchOutage
from searchr1.loop.checkpoint import CheckpointWriteError
from searchr1.loop.stop import Stopped
from searchr1.startup.errors import StartupError
from searchr1.trackers.base import MultiTracker, exit_status
from searchr1.trackers.console import ConsoleTracker


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as err:  # noqa: BLE001 - what a with block sees
        return err


def test_exit_status_of_each_ending(capsys):
    refused = StartupError("searchr1: run directory /r holds checkpoints but none is complete.\n"
                           "  - more")
    capsys.readouterr()
    disk = CheckpointWriteError(3, OSError(errno.ENOSPC, "No space left on device"))
    assert exit_status(None) == (0, None)
    assert exit_status(ValueError("boom")) == (1, None)
    assert exit_status(Stopped("stopped by SIGTERM", 2)) == (4, "stopped by SIGTERM")
    assert exit_status(SearchOutage("searches keep failing", 2)) == (3, "searches keep failing")
    assert exit_status(disk) == (5, "checkpoint of step 3 could not be written: "
                                    "[Errno 28] No space left on device")
    assert exit_status(refused) == (2, "run directory /r holds checkpoints but none is complete.")
    assert exit_status(SystemExit(0)) == (0, None) and exit_status(SystemExit("msg")) == (1, None)


@pytest.mark.parametrize("exc, line", [
    (Stopped("stopped by SIGTERM during the eval after step 2", 2),
     "run job stopped (exit code 4): stopped by SIGTERM during the eval after step 2"),
    (SearchOutage("searches keep failing", 1), "run job stopped (exit code 3): searches keep failing"),
    (RuntimeError("a crash"), "run job failed (exit code 1)"),
])
def test_the_console_prints_the_real_code_and_reason(capsys, exc, line):
    with pytest.raises(type(exc)), MultiTracker([ConsoleTracker(title="job")]):
        raise exc
    assert capsys.readouterr().out.strip() == line
