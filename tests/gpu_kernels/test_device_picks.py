"""The host's wait for a flag a whole-step graph raises (graphs/device_picks.wait_for_flag):
returns on its step, fails at once when a later step already raised it, and names both steps
when the wait runs out."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid.engine.graphs import device_picks
from hybrid.engine.graphs.device_picks import wait_for_flag
from hybrid.errors import DeviceLost


def test_the_flag_of_the_awaited_step_returns() -> None:
    wait_for_flag(np.array([0, 7], np.int64), 1, 7, "finish")


def test_a_flag_past_the_awaited_step_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A later step ended first (its picks overwrote this one's): no wait could end, so none
    is made (a day-long timeout here would hang the test otherwise)."""
    monkeypatch.setattr(device_picks, "TIMEOUT_S", 86400.0)
    with pytest.raises(DeviceLost, match="overtaken by step 11 before step 10"):
        wait_for_flag(np.array([11], np.int64), 0, 10, "finish")


def test_a_flag_behind_the_awaited_step_times_out_naming_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_picks, "TIMEOUT_S", 0.0)
    with pytest.raises(DeviceLost, match=r"did not finish within 0 s \(step 10 awaited, the "
                                         r"flag holds step 9\)"):
        wait_for_flag(np.array([9], np.int64), 0, 10, "finish")
