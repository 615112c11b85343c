"""`psrl tap`: a live, filtered view of a running run's bus.

Tapping only subscribes: it sends nothing, and a tap that falls behind loses events at its own
high-water mark without slowing the run (see docs/protocol.md, back-pressure).
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import zmq

from bus.addresses import BusAddresses
from bus.errors import BusError
from bus.schema import kinds_matching
from bus.security import load_keys
from bus.sockets import SocketOptions
from bus.subscriber import Subscriber
from bus.tap import PERIODIC_KINDS, TapFilter, format_json, format_line, hidden_kinds
from psrl.log import configure
from psrl.rundir import RunDir

TAP_HWM = 10_000
_MAX_BATCH = 100
_STATE_CHECK_S = 1.0  # how often a tap on a run directory looks whether the run has ended
ENDED_STATUSES = ("finished", "failed", "interrupted")


def run_ended(run_dir: Path | None) -> str | None:
    """'run NAME finished at HH:MM:SS: reason' once the launcher has recorded the end; None before (or
    without a run directory)."""
    if run_dir is None:
        return None
    try:
        state = RunDir(run_dir).read_state()
    except (OSError, ValueError):  # not there yet, or being rewritten
        return None
    status = state.get("status")
    if status not in ENDED_STATUSES:
        return None
    ended_at = state.get("ended_at")
    when = dt.datetime.fromtimestamp(float(ended_at)).strftime("%Y-%m-%d %H:%M:%S") if ended_at else "?"
    reason = state.get("reason") or ""
    return f"run {Path(run_dir).name} {status} at {when}" + (f": {reason}" if reason else "")


@click.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--address", help="Events address of a proxy (events_out), instead of reading RUN_DIR/bus.json.")
@click.option("--control-address", help="With --address: the control channel's address (control_out) too.")
@click.option("--kind", "kinds", multiple=True, help="Kind or kind prefix, e.g. gen.result or gen. (repeatable).")
@click.option("--actor", "actors", multiple=True, help="Sender name, or name#incarnation (repeatable).")
@click.option("--request", "request_ids", multiple=True, type=int, help="Request id (repeatable).")
@click.option("--version", "versions", multiple=True, type=int, help="Model version (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line instead of readable lines.")
@click.option("--count", type=int, default=0, help="Exit after this many events (0 = run until Ctrl-C).")
@click.option("--duration", type=float, default=0.0, help="Exit after this many seconds (0 = no limit).")
@click.option(
    "--all", "show_all", is_flag=True, help=f"Also show heartbeats and status reports ({', '.join(PERIODIC_KINDS)})."
)
def tap(
    *,
    run_dir: Path | None,
    address: str | None,
    control_address: str | None,
    kinds: tuple[str, ...],
    actors: tuple[str, ...],
    request_ids: tuple[int, ...],
    versions: tuple[int, ...],
    as_json: bool,
    count: int,
    duration: float,
    show_all: bool,
) -> None:
    """Show the events of a running run: psrl tap RUN_DIR [--kind gen.] [--json]."""
    _interruptible()
    configure("warning")  # bus warnings (dropped messages) go to stderr, never into the tapped stream
    ended = run_ended(run_dir)
    if ended is not None:
        click.echo(f"{ended}; nothing to tap. Its events are in its log: psrl replay {run_dir}", err=True)
        return
    hidden = hidden_kinds(kinds, show_all)
    filters = TapFilter(kinds, actors, request_ids, versions, hidden)
    if hidden:
        click.echo(f"(not shown: {', '.join(hidden)}; --all shows them)", err=True)
    for prefix in kinds:
        if not kinds_matching(prefix):
            click.echo(f"warning: no known kind starts with {prefix!r}", err=True)
    try:
        addresses, options = _resolve(run_dir, address, control_address)
    except BusError as exc:
        raise click.ClickException(str(exc)) from exc
    ctx = zmq.Context()
    subs = _subscribers(ctx, addresses, filters, options)
    try:
        num_shown = _show(subs, filters, as_json, count, duration, lambda: run_ended(run_dir))
    except KeyboardInterrupt:
        num_shown = -1
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): nothing left to report
        num_shown = -1
    finally:
        drops = sum(s.drops.total for s in subs)
        for sub in subs:
            sub.close()
        ctx.term()
    if num_shown >= 0 and drops:
        click.echo(f"{drops} malformed message(s) dropped", err=True)


def _interruptible() -> None:
    """Ctrl-C ends the tap even where its parent left SIGINT ignored or blocked: both survive exec, and
    Python only turns SIGINT into KeyboardInterrupt when it starts with the default (a test runner's
    worker or a script's background job would otherwise leave a tap that never stops)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _resolve(run_dir: Path | None, address: str | None, control_address: str | None) -> tuple[list[str], SocketOptions]:
    if address is None and run_dir is None:
        raise BusError("give a run directory or --address")
    if address is not None:
        return [a for a in (control_address, address) if a], SocketOptions(hwm=TAP_HWM)
    saved = BusAddresses.load(run_dir or Path("."))
    curve = load_keys(saved.curve_dir) if saved.curve_dir else None
    return [saved.control_out, saved.events_out], SocketOptions(hwm=TAP_HWM, curve=curve)


def _subscribers(
    ctx: zmq.Context[zmq.Socket[bytes]], addresses: list[str], filters: TapFilter, options: SocketOptions
) -> list[Subscriber]:
    return [Subscriber(ctx, a, filters.subscriptions(), options=options, name=f"tap:{a}") for a in addresses]


def _show(
    subs: list[Subscriber],
    filters: TapFilter,
    as_json: bool,
    count: int,
    duration: float,
    has_ended: Callable[[], str | None],
) -> int:
    """Print matching events until count or duration is reached, or the run ends; returns how many were shown."""
    poller = zmq.Poller()
    for sub in subs:
        poller.register(sub.socket, zmq.POLLIN)
    deadline = time.monotonic() + duration if duration > 0 else None
    render = format_json if as_json else format_line
    num_shown = 0
    next_check = time.monotonic() + _STATE_CHECK_S
    while count <= 0 or num_shown < count:
        wait_ms = 200 if deadline is None else int((deadline - time.monotonic()) * 1000)
        if wait_ms <= 0:
            break
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + _STATE_CHECK_S
            ended = has_ended()
            if ended is not None:
                click.echo(ended, err=True)
                break
        poller.poll(min(wait_ms, 200))
        for sub in subs:  # control first: it is listed first
            for _ in range(_MAX_BATCH):
                if (count > 0 and num_shown >= count) or not (sub.pending or sub.socket.poll(0)):
                    break
                event = sub.try_recv()
                if event is not None and filters.matches(event):
                    click.echo(render(event))
                    num_shown += 1
        sys.stdout.flush()
    return num_shown
