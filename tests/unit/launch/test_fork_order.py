"""The order in which the fork server imports actor classes (each class's actors are forked once it is imported)."""

from __future__ import annotations

import pytest

from launch.forkserver import AHEAD_CLASSES, import_order


def test_the_trainer_is_imported_first_and_unknown_classes_last() -> None:
    assert AHEAD_CLASSES[0] == "trainer"  # the first step waits for the trainer's model, so it starts first
    assert import_order(["coordinator", "custom", "rollout", "trainer", "ps"]) == [
        "trainer", "rollout", "ps", "coordinator", "custom"
    ]  # fmt: skip
    assert import_order(["b_extra", "a_extra"]) == ["b_extra", "a_extra"]  # others keep the plan's order


def test_a_late_reply_to_a_timed_out_fork_request_is_not_taken_as_the_next_ones_pid() -> None:
    import queue
    import time

    from launch.forkserver import ForkServer

    server = ForkServer.__new__(ForkServer)  # the reply matching alone, without a server process
    server._pids = queue.Queue()
    server._pids.put((1, 111))  # request 1 timed out; its pid arrives while request 2 waits
    server._pids.put((2, 222))
    assert server._pid_of(2, time.monotonic() + 1.0) == 222
    server._pids.put((3, 333))
    with pytest.raises(queue.Empty):  # a reply to another request never answers request 4
        server._pid_of(4, time.monotonic() + 0.05)
