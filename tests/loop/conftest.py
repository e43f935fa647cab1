"""Every test starts with no fault hook spent (``crash_point`` acts once per spec and process)."""

from __future__ import annotations

import pytest

from searchr1.utils import faults


@pytest.fixture(autouse=True)
def _fresh_fault_hooks():
    faults.reset()
    yield
    faults.reset()
