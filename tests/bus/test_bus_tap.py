"""`psrl tap` against a real proxy process and a real publisher process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bus.addresses import BUS_FILE, BusAddresses
from bus.messages import ActorState, FinishReason, GenerateResult, Heartbeat, Pause, TokenBatch
from bus.schema import Envelope, Event
from bus.tap import PERIODIC_KINDS, TapFilter, format_json, format_line, hidden_kinds

HERE = Path(__file__).parent
TAP = [sys.executable, "-m", "psrl.cli.main", "tap"]


def _wait_for_file(path: Path, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear (process exit code {process.poll()})")
        time.sleep(0.05)


class LiveRun:
    """A run directory with real processes: the proxy, the event logger and a publisher."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proxy = subprocess.Popen([sys.executable, "-m", "bus.proxy", str(run_dir)])
        self.logger: subprocess.Popen | None = None
        self.publisher: subprocess.Popen | None = None
        _wait_for_file(run_dir / BUS_FILE, self.proxy)
        self.logger = subprocess.Popen([sys.executable, "-m", "bus.eventlog", str(run_dir)], stderr=subprocess.PIPE)
        self.publisher = subprocess.Popen([sys.executable, str(HERE / "publisher_proc.py"), str(run_dir), "rollout-0"])

    @staticmethod
    def stop(process: subprocess.Popen | None) -> int | None:
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        return process.wait(30)

    def close(self) -> None:
        for process in (self.publisher, self.logger, self.proxy):
            self.stop(process)
        if self.logger is not None and self.logger.stderr is not None:
            self.logger.stderr.close()


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[LiveRun]:
    run = LiveRun(tmp_path)
    try:
        yield run
    finally:
        run.close()
    assert run.proxy.returncode == 0


def test_tap_shows_only_the_requested_kind_as_json(live_run: LiveRun) -> None:
    result = subprocess.run(
        [*TAP, str(live_run.run_dir), "--kind", "gen.result", "--json", "--count", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3
    assert {line["envelope"]["kind"] for line in lines} == {"gen.result"}
    first = lines[0]
    assert first["event_id"].startswith("rollout-0#0:")
    assert first["message"]["token_ids"] == [first["message"]["request_id"], first["message"]["request_id"] + 1]


def tapped_kinds(run_dir: Path, *options: str) -> set[str]:
    command = [*TAP, str(run_dir), "--json", "--count", "12", *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return {json.loads(line)["envelope"]["kind"] for line in result.stdout.splitlines()}


def test_tap_hides_heartbeats_unless_asked(live_run: LiveRun) -> None:
    assert tapped_kinds(live_run.run_dir) == {"gen.result", "obs.metrics"}
    assert "actor.heartbeat" in tapped_kinds(live_run.run_dir, "--all")
    assert tapped_kinds(live_run.run_dir, "--kind", "actor.") == {"actor.heartbeat"}


def test_periodic_kinds_are_hidden_by_default_and_shown_when_named() -> None:
    assert hidden_kinds((), show_all=False) == PERIODIC_KINDS
    assert hidden_kinds((), show_all=True) == ()
    assert "inst.status" not in hidden_kinds(("inst.",), show_all=False)
    assert "actor.heartbeat" in hidden_kinds(("inst.",), show_all=False)
    quiet = TapFilter(hidden=PERIODIC_KINDS)
    assert not quiet.matches(_event(Heartbeat(ActorState.IDLE)))
    assert quiet.matches(_event(Pause()))


# what the tap's parent leaves it: SIGINT's disposition and mask survive exec
SIGINT_LEFT = {
    "default": "pass",
    "ignored": "signal.signal(signal.SIGINT, signal.SIG_IGN)",
    "blocked": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})",
}


@pytest.mark.parametrize("left", list(SIGINT_LEFT))
def test_tap_by_address_with_actor_filter_and_ctrl_c(live_run: LiveRun, left: str) -> None:
    """Ctrl-C ends the tap whatever SIGINT's disposition its parent left it (a test runner's worker, a
    script's background job): it did not once in a while under pytest-xdist."""
    addresses = BusAddresses.load(live_run.run_dir)
    exec_tap = f"import os, signal, sys; {SIGINT_LEFT[left]}; os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    process = subprocess.Popen(
        [sys.executable, "-c", exec_tap, *TAP[1:], "--address", addresses.events_out, "--actor", "rollout-0#0",
         "--kind", "obs."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a tap that hangs shows where (below)
    )  # fmt: skip
    assert process.stdout is not None
    first = process.stdout.readline()
    assert " obs.metrics " in first and "rollout-0#0:" in first
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        _, stderr = process.communicate(timeout=30)
        pytest.fail(f"psrl tap did not exit within 30 s of SIGINT; its threads:\n{stderr[-8000:]}")
    assert process.returncode == 0
    assert "Traceback" not in stderr


def test_logged_run_replays_whole(live_run: LiveRun) -> None:
    """Proxy, logger and publisher processes: the log holds every event the publisher sent."""
    tapped = subprocess.run(
        [*TAP, str(live_run.run_dir), "--kind", "obs.", "--count", "5"], capture_output=True, timeout=120, check=False
    )
    assert tapped.returncode == 0
    assert live_run.stop(live_run.publisher) == 0
    assert live_run.stop(live_run.logger) == 0
    assert live_run.logger is not None and live_run.logger.stderr is not None
    assert "dropped 0 malformed; 0 events never arrived" in live_run.logger.stderr.read().decode()
    replayed = subprocess.run(
        [sys.executable, "-m", "psrl.cli.main", "replay", str(live_run.run_dir), "--check", "sequence", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    report = json.loads(replayed.stdout)
    timeline = report["timeline"]
    assert timeline["events_per_kind"]["obs.metrics"] >= 5
    assert timeline["events_per_kind"]["obs.metrics"] == timeline["events_per_kind"]["gen.result"]
    assert timeline["num_missing"] == 0 and timeline["problems"] == []
    assert report["checkers"][0]["agreement"]["num_disagree"] == 0


def test_tap_without_a_bus_says_what_is_missing(tmp_path: Path) -> None:
    result = subprocess.run([*TAP, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert f"{tmp_path / BUS_FILE} does not exist" in result.stderr


def _event(message: object, **envelope: object) -> Event:
    fields = {"kind": message.KIND, "schema_version": 1, "sender": "router", "incarnation": 2, "seq": 5}
    fields.update({"mono_ns": 1, "wall_ns": 1_700_000_000_000_000_000, **envelope})
    return Event(Envelope(**fields), message)  # type: ignore[arg-type]


def test_filters_match_actor_request_and_version() -> None:
    tokens = TokenBatch(
        request_ids=np.asarray([11], np.int64),
        counts=np.asarray([2], np.int32),
        token_ids=np.array([1, 2], np.int32),
        logprobs=np.zeros(2, np.float32),
        versions=np.zeros(2, np.int32),
        instance="i0",
    )
    event = _event(tokens, model_version=4)
    assert TapFilter(actors=("router",)).matches(event)
    assert TapFilter(actors=("router#2",)).matches(event)
    assert not TapFilter(actors=("router#1",)).matches(event)
    assert TapFilter(request_ids=(11,)).matches(event)
    assert not TapFilter(request_ids=(12,)).matches(event)
    assert TapFilter(versions=(4,)).matches(event) and not TapFilter(versions=(5,)).matches(event)
    assert TapFilter(request_ids=(8,)).matches(_event(Pause(), request_id=8))


def test_renderings_are_readable_and_valid_json() -> None:
    tokens = np.arange(20, dtype=np.int32)
    result = GenerateResult(3, 1, tokens, np.zeros(20, np.float32), np.ones(20, np.int32), FinishReason.LENGTH, "r1")
    event = _event(result, request_id=3, parent="rollout-1#0:9")
    line = format_line(event)
    assert "router#2:5" in line and "gen.result" in line and "req=3" in line and "parent=rollout-1#0:9" in line
    assert "finish_reason=length" in line and "int32[20][0,1,2,3,4,5,6,7,…+12]" in line
    data = json.loads(format_json(event))
    assert data["message"]["token_ids"] == list(range(20))
    assert data["message"]["finish_reason"] == "length"


def test_proxy_process_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    proxy = subprocess.Popen([sys.executable, "-m", "bus.proxy", str(tmp_path), "--transport", "tcp"])
    _wait_for_file(tmp_path / BUS_FILE, proxy)
    addresses = BusAddresses.load(tmp_path)
    assert addresses.events_in.startswith("tcp://127.0.0.1:") and not addresses.events_in.endswith("*")
    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait(30) == 0
    assert os.path.exists(tmp_path / BUS_FILE)


def test_nested_records_are_decoded_not_shown_as_bytes() -> None:
    # regression: `psrl tap --kind router.decision` printed the record field as raw msgpack bytes
    import msgspec

    from bus.messages import RoutingRecord

    record = msgspec.msgpack.encode({"seq": 7, "instance": "rollout-1", "inputs": {"loads": [1, 2]}})
    event = _event(RoutingRecord(12, "rollout-1", "round_robin", record), request_id=12)
    line = format_line(event)
    assert "record={seq:7,instance:rollout-1,inputs:{loads:[1,2]}}" in line and "b'" not in line
    data = json.loads(format_json(event))
    assert data["message"]["record"] == {"seq": 7, "instance": "rollout-1", "inputs": {"loads": [1, 2]}}
    garbage = _event(RoutingRecord(12, "rollout-1", "round_robin", b"\xc1\xc1\xc1"))
    assert json.loads(format_json(garbage))["message"]["record"] == "<3 bytes>"


def test_tap_on_a_finished_run_says_so_and_exits(tmp_path: Path) -> None:
    # regression: tapping a finished run waited silently
    from psrl.rundir import RunDir

    run = RunDir.create(tmp_path, "done")
    run.write_state(status="finished", ended_at=time.time(), reason="4 training steps done")
    result = subprocess.run([*TAP, str(run.path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "run done finished at" in result.stderr and "4 training steps done" in result.stderr
    assert "psrl replay" in result.stderr


def test_tap_stops_when_the_run_ends(live_run: LiveRun) -> None:
    from psrl.rundir import RunDir

    process = subprocess.Popen([*TAP, str(live_run.run_dir), "--kind", "obs."], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stdout is not None and " obs.metrics " in process.stdout.readline()
    RunDir(live_run.run_dir).write_state(status="interrupted", ended_at=time.time(), reason="interrupted by SIGINT")
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "interrupted at" in stderr and "interrupted by SIGINT" in stderr
