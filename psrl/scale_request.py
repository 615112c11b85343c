"""Ask a running run's supervisor for more or fewer rollout instances (`psrl scale`, `psrl.scale`).

    import psrl

    result = psrl.scale("runs/my-run", "rollout=+2")   # or "rollout=-1", "rollout=3"
    print(result.added, result.after)

The request goes over the run's own bus (``ctl.scale``, the addresses in ``RUN/bus.json``, CURVE
when the run uses it) and the supervisor answers with ``sup.scale``; the request is re-sent until
the answer comes (the supervisor answers a repeated request again without acting twice). A run that
is not running, an argument that is not ``ROLE=+N|-N|N`` and a refused request raise `ScaleError`
with the problem and the fix; a refused request changed nothing.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import zmq

from bus.addresses import BusAddresses
from bus.errors import BusError
from bus.messages import ScaleDecided, ScaleRequest
from bus.publisher import Publisher
from bus.schema import Channel
from bus.security import load_keys
from bus.sockets import SocketOptions
from bus.subscriber import Subscriber
from psrl.coordination.scaling import ScaleAsk, ScaleSpecError, parse_scale_spec
from psrl.processes import pid_alive
from psrl.rundir import RunDir

RESEND_S = 1.0  # re-send a request not answered within this long
LISTEN_WAIT_S = 10.0  # for the supervisor's subscription to scale requests
DEFAULT_TIMEOUT_S = 60.0


class ScaleError(RuntimeError):
    """The request could not be made, or the supervisor refused it (nothing changed)."""


@dataclass(frozen=True)
class ScaleResult:
    run: str
    before: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]

    @property
    def after(self) -> tuple[str, ...]:
        """The instances that serve once the removed ones have drained."""
        return tuple(n for n in self.before if n not in self.removed) + self.added


def resolve_run(run: str | Path, root: str | Path | None = None) -> Path:
    """A run directory, or a run name under ``root`` (default ``runs``)."""
    path = Path(run)
    if RunDir(path).state.exists():
        return path
    named = Path(root or "runs") / str(run)
    if RunDir(named).state.exists():
        return named
    raise ScaleError(
        f"unknown run {str(run)!r}: no run directory there or under {str(Path(root or 'runs'))!r}; "
        "give the run's directory (psrl launch prints it) or its name with --root"
    )


def check_running(run_dir: Path) -> None:
    """Only a running run has instances to scale: say which state it is in, and what to do instead."""
    state = RunDir(run_dir).read_state()
    status, name = state.get("status"), run_dir.name
    if status in ("finished", "failed", "interrupted"):
        raise ScaleError(
            f"run {name} is {status} ({state.get('reason') or 'no reason recorded'}): it has no instances to scale. "
            f"Launch it again (psrl launch <same preset and overrides> --name {name}) and scale that launch"
        )
    if status != "running":
        raise ScaleError(f"run {name} is {status or 'not started'}: wait until it is running, then scale it")
    pid = int(state.get("launcher_pid") or 0)
    if pid and not pid_alive(pid):
        raise ScaleError(
            f"run {name} says it is running but its launcher (pid {pid}) is gone: nothing to scale. "
            f"Resume it with psrl launch <same preset and overrides> --name {name}"
        )


def scale(
    run: str | Path,
    spec: str | ScaleAsk,
    *,
    root: str | Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    reason: str = "psrl scale",
) -> ScaleResult:
    """Ask run ``run`` to scale as ``spec`` says and wait for the supervisor's answer."""
    try:
        ask = parse_scale_spec(spec) if isinstance(spec, str) else spec
    except ScaleSpecError as error:
        raise ScaleError(str(error)) from None
    run_dir = resolve_run(run, root)
    check_running(run_dir)
    token = uuid.uuid4().hex[:16]
    request = ScaleRequest(token=token, role=ask.role, delta=ask.delta, target=ask.target, reason=reason)
    answer = _ask(run_dir, request, timeout_s)
    if answer.error:
        raise ScaleError(f"run {run_dir.name} refused {ask.describe()}: {answer.error} (nothing changed)")
    return ScaleResult(run_dir.name, tuple(answer.before), tuple(answer.added), tuple(answer.removed))


def _ask(run_dir: Path, request: ScaleRequest, timeout_s: float) -> ScaleDecided:
    try:
        addresses = BusAddresses.load(run_dir)
        options = SocketOptions(curve=load_keys(addresses.curve_dir) if addresses.curve_dir else None)
    except (BusError, OSError, ValueError) as error:
        raise ScaleError(f"cannot reach run {run_dir.name}'s bus: {error}") from None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    answers = Subscriber(ctx, addresses.events_out, [ScaleDecided.KIND], options=options, name="psrl-scale")
    # one sender per request: its events are numbered from 1 in the run's log, like any actor incarnation's
    publisher = Publisher(ctx, addresses, f"scale-{request.token}", options=options)
    try:
        if not publisher.wait_subscribed(LISTEN_WAIT_S, (Channel.CONTROL,), prefix=ScaleRequest.KIND):
            raise ScaleError(
                f"run {run_dir.name}'s supervisor does not listen for scale requests (still starting, or stopping): "
                "try again once it is running"
            )
        return _await_answer(run_dir, publisher, answers, request, timeout_s)
    finally:
        answers.close()
        publisher.close()
        ctx.destroy(linger=0)


def _await_answer(
    run_dir: Path, publisher: Publisher, answers: Subscriber, request: ScaleRequest, timeout_s: float
) -> ScaleDecided:
    deadline = time.monotonic() + timeout_s
    next_send = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_send:
            publisher.publish(request)
            next_send = time.monotonic() + RESEND_S
        for event in answers.recv_batch(200):
            message = event.message
            if isinstance(message, ScaleDecided) and message.token == request.token:
                return message
        try:
            check_running(run_dir)
        except ScaleError as error:
            raise ScaleError(f"{error} (it ended while the request waited for an answer)") from None
    raise ScaleError(f"run {run_dir.name} did not answer the scale request within {timeout_s:.0f} s")
