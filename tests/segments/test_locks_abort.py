"""`PartitionLock.acquire(check_abort=...)`: a wait for a busy lock ends with what the abort check raises, at once
and holding nothing, instead of running to its timeout (a cleaner told to stop while it waits)."""

from __future__ import annotations

import pytest

from segments.partition.locks import PartitionLock


class _Stop(Exception):
    pass


def test_an_abort_check_ends_the_wait_for_a_busy_lock_and_holds_nothing(tmp_path):
    held = PartitionLock(tmp_path, ".cleaner.lock").acquire()
    calls = []

    def check_abort() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise _Stop

    waiter = PartitionLock(tmp_path, ".cleaner.lock")
    with pytest.raises(_Stop):
        waiter.acquire(timeout_s=3600, check_abort=check_abort)  # an hour: only the check can end it here
    assert len(calls) == 3 and not waiter.held
    held.release()
    assert waiter.acquire(timeout_s=0, check_abort=check_abort).held  # free now: taken, the check not needed
    assert len(calls) == 3
    waiter.release()
