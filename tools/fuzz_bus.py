"""Fuzz every socket a live run binds, then check that the run went on as if nothing happened.

Launches a real run of the demo; once every actor serves, sends ``--frames`` hostile frames
(random bytes, truncated and wrongly typed bodies, other kinds' bodies, unsupported versions,
empty and oversized frames, replayed out-of-order heartbeats) to each socket bound in the run:
the events and control proxies (whose inputs reach every actor's subscribers and the event
log), the router's and each trainer rank's link, each PS shard's push and pull sockets. Then
the run must finish (exit 0) with no actor dead or restarted, every frame sent to a link or a PS
socket counted as dropped by its owner (`actor.drops` in the log), resident memory bounded, and
the replay agreeing 100% with the recorded decisions.

    python tools/fuzz_bus.py --quick          # 2k frames per socket, a few minutes on 2 cores
    python tools/fuzz_bus.py                  # 100k frames per socket (make fuzz)

Ends with ``RESULT frames=<n> crashes=<n> restarts=<n> uncounted=<n> max_rss_growth_mib=<x> ...``.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.eventlog.reader import EventLogReader
from bus.messages import ActorDrops, ActorExited, ActorRestarted
from launch.fuzz import AFTER_VERSIONS, STOP_REASON, BusFuzzer, TargetResult, counted_by, uncounted
from launch.supervisor import EXIT_INTERRUPTED, EXIT_OK, Supervisor
from psrl.config import Config, load_config
from psrl.log import configure
from psrl.preflight import checked
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir

WORKLOAD = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo", "bus.handshake_timeout_s=180"]
CHECKERS = ["routing", "sync", "ledger"]
STEP_LIMIT = 100_000  # more than any flood outlasts: the fuzzer ends the run once it trained on after it
MIB = 1 << 20


@dataclass
class FuzzOutcome:
    exit_code: int
    reason: str | None
    results: list[TargetResult]
    drops: dict[str, dict[str, int]]  # actor -> its last reported counts
    deaths: int
    restarts: int
    replay: dict[str, tuple[int, int]]  # checker -> (agree, decisions)
    error: str | None
    outlasted: bool  # the run went on until every sender finished (else later frames hit no one)
    versions_after: int  # versions the run published after the flood
    run_dir: Path
    num_targets: int


def run_fuzz(config: Config, frames: int, seed: int, root: Path) -> FuzzOutcome:
    supervisor = Supervisor(config, RunDir.create(root, f"fuzz-{seed}"))
    fuzzer = BusFuzzer(supervisor, frames, seed)
    fuzzer.start()
    code = supervisor.run()
    fuzzer.done.wait(120)  # a sender may still be finishing its socket
    events = [e.event for e in EventLogReader(supervisor.run_dir.events).events()]
    drops: dict[str, dict[str, int]] = {}
    for event in events:
        if isinstance(event.message, ActorDrops):
            drops[event.envelope.sender] = dict(event.message.counts)
    report = replay_run(supervisor.run_dir.path, CHECKERS)
    return FuzzOutcome(
        code,
        supervisor.end_reason,
        fuzzer.results,
        drops,
        sum(isinstance(e.message, ActorExited) for e in events),
        sum(isinstance(e.message, ActorRestarted) for e in events),
        {c.name: (c.agreement.num_agree, c.agreement.num_decisions - c.agreement.num_skipped) for c in report.checkers},
        fuzzer.error,
        fuzzer.outlasted,
        fuzzer.versions_after,
        supervisor.run_dir.path,
        len(fuzzer.targets()),
    )


def ran_ok(outcome: FuzzOutcome) -> bool:
    """The run finished, or trained on after the flood until the fuzzer stopped it."""
    stopped = outcome.exit_code == EXIT_INTERRUPTED and outcome.reason == STOP_REASON
    return outcome.exit_code == EXIT_OK or (stopped and outcome.versions_after >= AFTER_VERSIONS)


def print_outcome(outcome: FuzzOutcome) -> None:
    print(f"{'socket':<22}{'sent':>9}{'unsent':>8}{'cut':>9}{'frames/s':>10}{'counted':>10}{'rss MiB':>10}")
    for r in outcome.results:
        name = f"{r.target.owner}:{r.target.label}"
        rate = r.sent / r.seconds if r.seconds else 0.0
        growth = r.rss_growth / MIB
        cut = f"{r.cut}/{r.oversized}"
        counted = counted_by(outcome.drops, r)
        print(f"{name:<22}{r.sent:>9}{r.unsent:>8}{cut:>9}{rate:>10.0f}{counted:>10}{growth:>+10.1f}")
    print(f"replay agreement: {outcome.replay}")
    verdict = "ran on" if ran_ok(outcome) else f"failed (exit {outcome.exit_code})"
    print(
        f"run {verdict}: {outcome.reason} ({outcome.run_dir})"
        + (f"; fuzzer error {outcome.error}" if outcome.error else "")
        + ("" if outcome.outlasted else "; the run ended before the senders did: raise --steps")
        + f"; {outcome.versions_after} versions published after the flood"
    )


def result_line(outcome: FuzzOutcome) -> str:
    agree = sum(a for a, _ in outcome.replay.values())
    total = sum(t for _, t in outcome.replay.values())
    return (
        f"RESULT frames={sum(r.sent for r in outcome.results)} sockets={len(outcome.results)} "
        f"sockets_bound={outcome.num_targets} "
        f"crashes={outcome.deaths} restarts={outcome.restarts} uncounted={uncounted(outcome.results, outcome.drops)} "
        f"oversized={sum(r.oversized for r in outcome.results)} cut={sum(r.cut for r in outcome.results)} "
        f"max_rss_growth_mib={max((r.rss_growth for r in outcome.results), default=0) / MIB:.1f} "
        f"run_ok={int(ran_ok(outcome))} fuzzed_live={int(outcome.outlasted)} "
        f"replay_agreement={agree / total if total else float('nan'):.4f}"
    )


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2k frames per socket")
    parser.add_argument("--frames", type=int, default=None, help="frames per socket")
    parser.add_argument(
        "--steps", type=int, default=STEP_LIMIT, help="training steps at most (the fuzzer stops the run)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--root", type=Path, default=None, help="where the run directory goes")
    parser.add_argument("overrides", nargs="*", help="config overrides")
    args = parser.parse_args(argv)
    configure("warning")
    frames = args.frames or (2000 if args.quick else 100_000)
    config = checked(load_config("demo", [*WORKLOAD, f"trainer.total_steps={args.steps}", *args.overrides]))
    outcome = run_fuzz(config, frames, args.seed, args.root or Path(tempfile.mkdtemp(prefix="psrl-fuzz-")))
    print_outcome(outcome)
    print(result_line(outcome))


if __name__ == "__main__":
    main()
