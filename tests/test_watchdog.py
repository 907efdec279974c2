"""The watchdog's pure parts: the hang bound worked out by hand, and the fault hook that wedges a call once.
The watchdog on real Ray actors and in a real run: tests/test_hangs.py."""

from __future__ import annotations

import threading
import time

import pytest

from posttrain.remote import faults
from posttrain.remote.watchdog import RECENT, hang_bound, role_family


def test_hang_bound_by_hand():
    # median of [2, 4, 3] is 3 s; x5 = 15 s, above the 10 s floor
    assert hang_bound([2.0, 4.0, 3.0], factor=5, min_s=10, cold_s=900) == 15.0
    # ... below a 60 s floor: the floor
    assert hang_bound([2.0, 4.0, 3.0], factor=5, min_s=60, cold_s=900) == 60.0
    # an even count: median of [1, 2, 3, 10] is (2 + 3) / 2 = 2.5 s; x4 = 10 s (one slow call moves it little)
    assert hang_bound([1.0, 2.0, 3.0, 10.0], factor=4, min_s=1, cold_s=900) == 10.0
    # fewer than 3 measured: the cold bound, never below the floor
    assert hang_bound([], factor=5, min_s=60, cold_s=900) == 900.0
    assert hang_bound([2.0, 4.0], factor=5, min_s=60, cold_s=900) == 900.0
    assert hang_bound([2.0, 4.0], factor=5, min_s=60, cold_s=30) == 60.0
    # only the last RECENT (20) count: five old 100 s calls, then 1, 2, ..., 20 s: median (10 + 11) / 2 = 10.5 s
    assert RECENT == 20
    assert hang_bound([100.0] * 5 + [float(s) for s in range(1, 21)], factor=5, min_s=1, cold_s=900) == 52.5


def test_role_family_groups_numbered_roles():
    assert [role_family(r) for r in ("rollout0", "rollout12", "trainer", "trainer3", "reward_model")] == [
        "rollout", "rollout", "trainer", "trainer", "reward_model"]


def _call_in_thread(point: str) -> threading.Thread:
    t = threading.Thread(target=faults.maybe_wedge, args=(point,), daemon=True)  # a wedged one never ends
    t.start()
    return t


def test_maybe_wedge_costs_nothing_unset_and_wedges_exactly_one_caller(tmp_path, monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    (tmp_path / "wedge-reward").write_text("")
    faults.maybe_wedge("reward")  # unset: returns at once, the file is not even looked at
    assert (tmp_path / "wedge-reward").exists()

    monkeypatch.setenv(faults.ENV, str(tmp_path))
    faults.maybe_wedge("generate")  # no trigger for this point: returns at once
    callers = [_call_in_thread("reward") for _ in range(8)]  # 8 callers race for one trigger
    deadline = time.monotonic() + 5
    while sum(t.is_alive() for t in callers) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert sum(t.is_alive() for t in callers) == 1  # exactly one wedged; the others returned
    assert not (tmp_path / "wedge-reward").exists()  # consumed
    assert [p.name.split(".taken-by-")[0] for p in tmp_path.iterdir()] == ["wedge-reward"]

    armed = faults.arm(tmp_path, "reward")  # armed again: the next caller wedges
    assert armed == tmp_path / "wedge-reward" and armed.exists()
    wedged = _call_in_thread("reward")
    wedged.join(0.3)
    assert wedged.is_alive() and not armed.exists()


def test_actors_get_the_fault_dir_only_when_the_driver_has_one(monkeypatch):
    from posttrain.orchestration.runtime import QUIET_ACTOR_ENV, actor_env

    monkeypatch.delenv(faults.ENV, raising=False)
    assert actor_env() == QUIET_ACTOR_ENV
    monkeypatch.setenv(faults.ENV, "/tmp/faults")
    assert actor_env() == {**QUIET_ACTOR_ENV, faults.ENV: "/tmp/faults"}


def test_arm_names_the_points():
    with pytest.raises(ValueError, match="unknown fault point 'sync'; one of generate, reward, train"):
        faults.arm("/tmp", "sync")
