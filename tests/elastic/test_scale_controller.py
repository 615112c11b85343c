"""The supervisor's scale controller: answers once per request, starts and retires instances, shuts a
retiring one down when drained or at its timeout, and keeps a lost one down under restart_rollout=false."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from bus.messages import InstanceDrained, ScaleDecided, ScaleRequest, Shutdown
from bus.schema import Message
from launch.plan import ActorSpec
from launch.scale import ScaleController
from launch.scale_placement import HostPlacement


@dataclass
class _Process:  # the outer edge: the controller only signals processes
    signals: list[int] = field(default_factory=list)

    def signal(self, signum: int) -> None:
        self.signals.append(signum)


def _controller(*, restart_rollout: bool = True, room: int = 4) -> tuple[ScaleController, list[Message], list[str]]:
    published: list[Message] = []
    started: list[str] = []
    processes: dict[str, Any] = {"ps-0": _Process(), "rollout-0": _Process(), "rollout-1": _Process()}

    def start(spec: ActorSpec) -> Any:
        started.append(spec.name)
        processes[spec.name] = _Process()
        return processes[spec.name]

    controller = ScaleController(HostPlacement(room), published.append, start, processes, 5.0,
                                 restart_rollout=restart_rollout)  # fmt: skip
    return controller, published, started


def test_a_request_is_applied_once_and_answered_again_when_re_sent() -> None:
    controller, published, started = _controller()
    request = ScaleRequest(token="a", role="rollout", delta=2)
    first = controller.on_request(request)
    second = controller.on_request(request)
    assert first == second and first.added == ["rollout-2", "rollout-3"] and first.before == ["rollout-0", "rollout-1"]
    assert started == ["rollout-2", "rollout-3"]  # not four
    assert published == [first, first]
    assert controller.active == ["rollout-0", "rollout-1", "rollout-2", "rollout-3"]


def test_a_refused_request_changes_nothing() -> None:
    controller, _, started = _controller(room=3)
    answer = controller.on_request(ScaleRequest(token="b", role="rollout", delta=2))
    assert answer.error and "room for 3" in answer.error and not answer.added
    refused = controller.on_request(ScaleRequest(token="c", role="rollout", delta=-1), refuse="stopping")
    assert refused.error == "stopping" and not refused.removed
    assert started == [] and controller.active == ["rollout-0", "rollout-1"] and not controller.retiring


def test_a_retiring_instance_is_shut_down_once_drained_and_its_exit_is_not_restarted() -> None:
    controller, published, _ = _controller()
    controller.on_request(ScaleRequest(token="d", role="rollout", delta=-1))
    assert controller.active == ["rollout-0"] and "rollout-1" in controller.retiring
    controller.on_drained(InstanceDrained(instance="rollout-1", num_moved=3))
    shutdowns = [m for m in published if isinstance(m, Shutdown)]
    assert [s.targets for s in shutdowns] == [["rollout-1"]]
    assert controller.takes_death("rollout-1") and "rollout-1" not in controller.processes
    assert not controller.takes_death("rollout-0")  # any other death goes to the restart policy


def test_a_retiring_instance_that_never_drains_is_shut_down_at_its_timeout_then_killed() -> None:
    controller, published, _ = _controller()
    controller.on_request(ScaleRequest(token="e", role="rollout", delta=-1))
    deadline = controller.retiring["rollout-1"].deadline
    controller.tick(deadline - 0.1)
    assert not [m for m in published if isinstance(m, Shutdown)]
    controller.tick(deadline + 0.1)
    assert [m.targets for m in published if isinstance(m, Shutdown)] == [["rollout-1"]]
    process = controller.processes["rollout-1"]
    controller.tick(controller.retiring["rollout-1"].shutdown_at + 60.0)  # type: ignore[operator]
    assert process.signals == [signal.SIGKILL]


def test_an_instance_lost_for_good_leaves_the_set_only_when_restarts_are_off() -> None:
    controller, published, _ = _controller()
    assert controller.loses_for_good("rollout-1", "killed") is None  # restarted as before
    controller, published, _ = _controller(restart_rollout=False)
    lost = controller.loses_for_good("rollout-1", "host gone")
    assert isinstance(lost, ScaleDecided) and lost.removed == ["rollout-1"] and lost.token == ""
    assert controller.active == ["rollout-0"] and published == [lost]
    assert controller.loses_for_good("ps-0", "killed") is None  # only rollout instances
    again = controller.on_request(ScaleRequest(token="f", role="rollout", delta=1))
    assert again.added == ["rollout-2"]  # a lost instance's index is not reused


def test_an_added_instance_that_dies_before_serving_leaves_the_set_without_a_restart() -> None:
    controller, _, _ = _controller()  # restarts on: a serving instance would be restarted
    controller.on_request(ScaleRequest(token="g", role="rollout", delta=2))
    controller.joined("rollout-2")
    assert controller.loses_for_good("rollout-2", "killed") is None  # it served: restarted as any
    failed = controller.loses_for_good("rollout-3", "exit code 1")
    assert failed is not None and failed.removed == ["rollout-3"] and "failed to start" in failed.reason
    assert controller.active == ["rollout-0", "rollout-1", "rollout-2"]


def test_a_retiring_instance_holds_its_room_until_it_exits() -> None:
    controller, _, _ = _controller(room=3)
    controller.on_request(ScaleRequest(token="h", role="rollout", delta=-1))  # rollout-1 drains
    refused = controller.on_request(ScaleRequest(token="i", role="rollout", delta=2))
    assert refused.error and "room for 2" in refused.error and refused.limit == 2
    controller.takes_death("rollout-1")
    assert controller.on_request(ScaleRequest(token="j", role="rollout", delta=2)).added == ["rollout-2", "rollout-3"]
