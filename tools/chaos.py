"""Chaos: real runs of the demo with actors killed (SIGKILL) and hung (SIGSTOP) at seeded random times.

Each case launches a real run (every actor its own process, the real bus), injects its faults
while the run trains, and lets the run end: it must either finish or stop with a clear reason.
Then an independent check over the raw event log (`psrl.reliability.invariants`) proves that
no prompt group was lost or consumed twice, the staleness bound held, no instance loaded a
version the PS had not verified on every shard, every interrupted request continued from its
own tokens and the trainer's versions stayed consecutive. Recovery is the time from the signal
to the replacement's Ready.

``--workload agentic`` runs multi-turn sessions (the ``agentic`` preset: a session scheduler and
its env worker processes) and adds two targets: ``session`` (the scheduler, which rebuilds its
sessions from the event log) and ``env`` (an env worker process, killed; it heals when the pool's
replacement reports ready, ``session.env_worker``). The log check then also proves that no session
was lost, no turn or environment step applied twice, and every finished session's response is
exactly its turns and the environment's answers.

    python tools/chaos.py --workload agentic --quick            # 2 cases, 8 faults, session and env included
    python tools/chaos.py --workload agentic --cases 6 --faults 8   # 48 faults (make chaos-agentic)

``--workload agent`` runs agents that bring their own loop (``examples/agent_openai``: an openai-SDK
agent per session, in the session scheduler's env workers, through the session gateway) and kills
the scheduler with its gateway, instances, the router and env workers while the agents' calls are
in flight: a restarted scheduler rebuilds its sessions from the log and runs their agents again,
whose calls get the logged turns back (``psrl.gateway.resume``). Besides the log check (no session
lost, no turn applied twice) each case's log is replayed (``psrl replay --check all``); its
disagreements are counted (``replay_disagree``).

    python tools/chaos.py --workload agent --quick              # 2 cases, 4 faults each
    python tools/chaos.py --workload agent --cases 4 --faults 6     # make chaos-agent

    python tools/chaos.py --quick                 # 2 cases, ~6 faults, a few minutes on 2 cores
    python tools/chaos.py --cases 25 --faults 8 topology.warm_spares=2   # 200 faults (make chaos-full)
    python tools/chaos.py --roles router,coordinator   # the roles that own run state, rebuilt from the log

Faults can be timed against weight syncs: ``--anchored 0.5`` times half of them within 0.5 s of a
version's publication, the coordinator's sync command or an instance's load (a router killed then is
down while the instances load and the coordinator's requests queue for it). ``--plan`` gives the
faults of every case explicitly, in order, for multi-role plans; ``--curve`` runs every case over
CURVE (``bus.curve=on``), where each weight pull authenticates.

    python tools/chaos.py --cases 4 --anchored 0.5 --roles router,coordinator,ps,rollout
    python tools/chaos.py --cases 4 --plan rollout-0@4,ps-1@5,router@publish+0.1   # SIGKILLs in order
    python tools/chaos.py --quick --curve

Replacements are forked from the fork server (as warm as a spare). With ``topology.fork_server=false``
and ``topology.warm_spares`` > 0 (the default is 1) each fault waits for the spares to be ready, so
replacements are warm; ``topology.warm_spares=0`` there measures cold replacements.

    python tools/chaos.py --quick topology.fork_server=false topology.warm_spares=0   # cold replacements

Elastic rollout: ``--elastic 0.5`` mixes scale-ups and scale-downs (one rollout instance more or fewer,
asked over the run's bus as `psrl scale` does) in between the faults, before about half of them; the
run's room is ``topology.max_rollout_instances`` (two more than it starts with unless given). A kill may
then land on an instance that was just added, and a retired instance's requests continue elsewhere.

    python tools/chaos.py --quick --elastic 0.5 --roles rollout,router
    # make chaos-elastic: 3 runs, 6 faults each, a scale event before about 60% of them
    python tools/chaos.py --cases 3 --faults 6 --steps 12 --elastic 0.6 --roles rollout,router,coordinator,ps

Ends with ``RESULT faults=<n> planned_faults=<n> lost=<n> duplicated=<n> mixed_versions=<n> max_recovery_s=<s> ...
warm_restarts=<n> warm_recovery_p50_s=<s> warm_max_recovery_s=<s> scale_ups=<n> scale_downs=<n>
scale_refused=<n>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bus.eventlog.reader import EventLogReader
from launch.chaos import SCALE_DOWN, SCALE_UP, FaultInjector, mix_scale_events
from launch.plan import plan_actors
from launch.policy import RestartPolicy
from launch.supervisor import EXIT_INTERRUPTED, EXIT_OK, Supervisor
from psrl.config import Config, load_config
from psrl.log import configure
from psrl.preflight import checked
from psrl.reliability.faults import (
    ENV_WORKERS,
    Fault,
    Recovery,
    cold_starts,
    parse_plan,
    percentile,
    plan_faults,
    recoveries,
)
from psrl.reliability.invariants import InvariantReport, check_invariants
from psrl.rundir import RunDir

# Long responses on small engine batches: generation outlasts a training step, so a fault lands
# mid-generation, mid-pull or mid-push rather than between them.
WORKLOAD = [
    "psrl.staleness_buffer_entries=8",
    "psrl.rollout_n=4",
    "task.name=demo",
    "engine.cpu_kernels=off",
    "task.response_lengths=long_tail",
    "task.long_tail_median=120",
    "engine.max_num_seqs=4",
    "task.max_response_length=320",
    "topology.n_ps_shards=2",
    "bus.handshake_timeout_s=180",
]
# Multi-turn sessions with slow tools: a fault lands while sessions wait at their environment, run
# a step in an env worker or generate a turn. Small groups, so a case trains its steps in minutes.
AGENTIC_WORKLOAD = [
    "psrl.staleness_buffer_entries=8",
    "psrl.rollout_n=4",
    "engine.cpu_kernels=off",
    "env.latency_ms=300",
    "env.step_timeout_s=30",  # a loaded 2-core machine: a step is not stuck after the preset's 10 s
    "topology.n_ps_shards=2",
    "bus.handshake_timeout_s=180",
]
# An openai-SDK agent per session through the session gateway: every turn is an agent's HTTP call,
# so a fault lands while calls wait for their turns, agents run in env workers, or turns generate.
AGENT_CONFIG = str(Path(__file__).resolve().parents[1] / "examples" / "agent_openai" / "config.yaml")
AGENT_WORKLOAD = [
    "topology.n_ps_shards=2",
    "bus.handshake_timeout_s=180",
    "agent.timeout_s=300",  # a loaded 2-core machine with an instance or the router down for seconds
]
WORKLOADS = {
    "demo": ("demo", WORKLOAD),
    "agentic": ("agentic", AGENTIC_WORKLOAD),
    "agent": (AGENT_CONFIG, AGENT_WORKLOAD),
}
CASE_DEADLINE_S = 900.0  # the slowest case seen took 300 s at load 9 on 2 cores
DEFAULT_ROLES = ("rollout", "ps", "router", "coordinator", "trainer", "logger")
SESSION_ROLES = ("session", "env")  # the agentic workload's: the session scheduler, an env worker
AGENT_ROLES = ("session", "rollout", "router", "env")  # the agent workload's: the gateway's scheduler first


def fault_targets(config: Config, roles: tuple[str, ...]) -> list[str]:
    """The actors of ``roles``; ``env`` names each session scheduler's env workers (``session/env``)."""
    specs = plan_actors(config)
    targets = [spec.name for spec in specs if spec.role in roles]
    if "env" in roles:
        targets += [spec.name + ENV_WORKERS for spec in specs if spec.role == "session"]
    return targets


@dataclass
class CaseResult:
    seed: int
    exit_code: int
    reason: str | None
    report: InvariantReport
    recoveries: list[Recovery]
    cold_starts: dict[str, float]
    skipped: list[str]
    wall_s: float
    scaled: list[tuple[str, str]] = field(default_factory=list)  # elastic events done: (kind, instance)
    refused: list[str] = field(default_factory=list)  # elastic events the run refused (no room, last one)
    replay_disagree: int | None = None  # decisions ``psrl replay --check all`` disagrees with (when replayed)
    num_planned: int = 0  # faults planned (a run that ends first leaves the rest uninjected)


@dataclass(frozen=True)
class Plan:
    """How each case's faults are drawn: at random (``roles``, ``num_faults``...) or given (``explicit``)."""

    roles: tuple[str, ...]
    num_faults: int
    gap_s: float
    anchored_share: float = 0.0
    explicit: str = ""
    elastic_share: float = 0.0  # share of faults preceded by a scale-up or scale-down

    def faults(self, seed: int, config: Config) -> list[Fault]:
        targets = fault_targets(config, self.roles)
        if self.explicit:
            faults = parse_plan(self.explicit, [spec.name for spec in plan_actors(config)] + targets)
        else:
            faults = plan_faults(
                seed, targets, self.num_faults, mean_gap_s=self.gap_s, anchored_share=self.anchored_share
            )
        return mix_scale_events(seed, faults, self.elastic_share, self.gap_s)


def run_case(
    seed: int, config: Config, plan_of: Plan, root: Path, deadline_s: float = CASE_DEADLINE_S, replay: bool = False
) -> CaseResult:  # fmt: skip
    plan = plan_of.faults(seed, config)
    num_faults = sum(f.kind not in (SCALE_UP, SCALE_DOWN) for f in plan)
    supervisor = Supervisor(config, RunDir.create(root, f"chaos-{seed}"))
    # the harness measures recovery, so the restart budget must not be what ends a run
    supervisor.policy = RestartPolicy(max_restarts=num_faults + 1)
    injector = FaultInjector(supervisor, plan, num_env_workers=config.env.num_workers if config.env.enable else 0)
    supervisor.listeners = (*supervisor.listeners, injector.on_event)
    injector.start()
    started = time.monotonic()
    code = supervisor.run_within(deadline_s, f"chaos: the case did not finish within {deadline_s:.0f} s")
    events = [e.event for e in EventLogReader(supervisor.run_dir.events).events()]
    return CaseResult(
        seed,
        code,
        supervisor.end_reason,
        check_invariants(events, config.psrl.staleness),
        recoveries(injector.injected, events),
        cold_starts(events),
        injector.skipped,
        time.monotonic() - started,
        injector.scaled,
        injector.refused,
        replay_disagreements(supervisor.run_dir.path) if replay else None,
        num_faults,
    )


def replay_disagreements(run_dir: Path) -> int:
    """Decisions of the run that ``psrl replay --check all`` disagrees with."""
    from psrl.replay.runner import replay_run

    return sum(checker.agreement.num_disagree for checker in replay_run(run_dir, ["all"]).checkers)


def describe(case: CaseResult) -> str:
    times = [f"{r.fault.kind} {r.fault.target} {_secs(r.seconds)}{' warm' if r.warm else ''}" for r in case.recoveries]
    times = [t + (f" @{r.fault.anchor}" if r.fault.anchor else "") for t, r in zip(times, case.recoveries, strict=True)]
    verdict = "finished" if case.exit_code == EXIT_OK else f"exit {case.exit_code}: {case.reason}"
    bad = {k: v for k, v in case.report.violations.items() if v}
    sessions = case.report.sessions
    return (
        f"seed {case.seed}: {verdict} in {case.wall_s:.0f} s; {len(case.recoveries)} of {case.num_planned} planned "
        f"faults ({', '.join(times)}); "
        f"{case.report.num_buffers_consumed} buffers, {case.report.num_groups_consumed} groups, "
        f"{case.report.num_continuations} continuations, {case.report.num_checks} checks; "
        + (
            f"{sessions.num_sessions} sessions, {sessions.num_finished} finished, "
            f"failed by rule {dict(sessions.failed) or 'none'}; "
            if sessions.num_sessions
            else ""
        )
        + (f"scaled {[f'{k}:{n}' for k, n in case.scaled]}; " if case.scaled else "")
        + (f"scale refused {len(case.refused)}; " if case.refused else "")
        + (f"replay disagrees {case.replay_disagree}; " if case.replay_disagree is not None else "")
        + f"violations {bad or 'none'}"
        + (f"; skipped {case.skipped}" if case.skipped else "")
    )


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}s"


def recovery_ratios(case: CaseResult) -> list[float]:
    """Each recovery over the same actor's cold start in the same run (both pay process start and setup)."""
    return [
        r.seconds / case.cold_starts[r.fault.target]
        for r in case.recoveries
        if r.seconds is not None and case.cold_starts.get(r.fault.target, 0) > 0
    ]


def role_lines(cases: list[CaseResult]) -> list[str]:
    by_role: dict[str, list[Recovery]] = {}
    for case in cases:
        for r in case.recoveries:
            by_role.setdefault(r.fault.target.split("-")[0], []).append(r)
    lines = []
    for role, recs in sorted(by_role.items()):
        healed = [r.seconds for r in recs if r.seconds is not None]
        detect = [r.detect_s for r in recs if r.detect_s is not None]
        warm = [r.seconds for r in recs if r.seconds is not None and r.warm]
        cold = [r.seconds for r in recs if r.seconds is not None and not r.warm]
        lines.append(
            f"  {role:<12} faults={len(recs):<4} recovered={len(healed):<4} p50={percentile(healed, 0.5):6.2f}s "
            f"p90={percentile(healed, 0.9):6.2f}s max={max(healed, default=0.0):6.2f}s "
            f"detect_p50={percentile(detect, 0.5):5.2f}s warm={len(warm)} warm_p50={percentile(warm, 0.5):6.2f}s "
            f"cold={len(cold)} cold_p50={percentile(cold, 0.5):6.2f}s"
        )
    return lines


def summary_line(cases: list[CaseResult]) -> str:
    recs = [r for c in cases for r in c.recoveries]
    healed = [r.seconds for r in recs if r.seconds is not None]
    warm = [r.seconds for r in recs if r.seconds is not None and r.warm]
    ratios = [x for c in cases for x in recovery_ratios(c)]
    totals = {key: sum(c.report.violations[key] for c in cases) for key in cases[0].report.violations}
    by_kind = {kind: sum(1 for r in recs if r.fault.kind == kind) for kind in ("kill", "stop")}
    return (
        f"RESULT faults={len(recs)} planned_faults={sum(c.num_planned for c in cases)} kills={by_kind['kill']} "
        f"stops={by_kind['stop']} lost={totals['lost']} "
        f"duplicated={totals['duplicated']} mixed_versions={totals['mixed_versions']} "
        f"staleness_violations={totals['staleness']} broken_continuations={totals['continuations']} "
        f"version_jumps={totals['versions']} sessions_lost={totals['sessions_lost']} "
        f"sessions_applied_twice={totals['sessions_applied_twice']} sessions_broken={totals['sessions_broken']} "
        f"sessions={sum(c.report.sessions.num_sessions for c in cases)} "
        f"sessions_failed={sum(sum(c.report.sessions.failed.values()) for c in cases)} "
        f"unrecovered={len(recs) - len(healed)} "
        f"runs_ok={sum(c.exit_code == EXIT_OK for c in cases)}/{len(cases)} "
        f"checks={sum(c.report.num_checks for c in cases)} "
        f"recovery_p50_s={percentile(healed, 0.5):.2f} recovery_p90_s={percentile(healed, 0.9):.2f} "
        f"max_recovery_s={max(healed, default=0.0):.2f} "
        f"recovery_vs_cold_start_p50={percentile(ratios, 0.5):.2f} "
        f"warm_restarts={len(warm)} warm_recovery_p50_s={percentile(warm, 0.5):.2f} "
        f"warm_max_recovery_s={max(warm, default=0.0):.2f} "
        f"scale_ups={sum(k == SCALE_UP for c in cases for k, _ in c.scaled)} "
        f"scale_downs={sum(k == SCALE_DOWN for c in cases for k, _ in c.scaled)} "
        f"scale_refused={sum(len(c.refused) for c in cases)}" + _replay_field(cases)
    )


def _replay_field(cases: list[CaseResult]) -> str:
    replayed = [c.replay_disagree for c in cases if c.replay_disagree is not None]
    return f" replay_disagree={sum(replayed)}" if replayed else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 cases of 3 faults (30 steps each; agentic: 4)")
    parser.add_argument("--cases", type=int, default=None, help="runs, one seed each")
    parser.add_argument("--faults", type=int, default=None, help="faults per run")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    parser.add_argument(
        "--case-deadline",
        type=float,
        default=CASE_DEADLINE_S,
        help="seconds after which a case that has not finished is stopped (and counted as failed)",
    )
    parser.add_argument("--gap", type=float, default=4.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first case")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="demo", help="what each case trains")
    parser.add_argument(
        "--roles", default=None, help="roles to fault, comma separated (default: every restartable one of the workload)"
    )
    parser.add_argument("--root", type=Path, default=None, help="where the run directories go")
    parser.add_argument("--anchored", type=float, default=0.0, help="share of faults timed against a sync moment")
    parser.add_argument("--plan", default="", help="explicit faults of every case, e.g. rollout-0@4,router@publish+0.1")
    parser.add_argument("--curve", action="store_true", help="every case over CURVE (bus.curve=on)")
    parser.add_argument(
        "--elastic", type=float, default=0.0, help="share of faults preceded by a rollout scale-up or scale-down"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides for every case")
    args = parser.parse_args()
    configure("warning")
    agentic, agent = args.workload == "agentic", args.workload == "agent"
    cases, faults = (2, 4 if agentic or agent else 3) if args.quick else (25, 8)
    # the demo workload's steps take well under a second: a run must outlast the warm spare's start (faults
    # wait for it) and every fault with its recovery; agentic cases train their few steps in minutes
    steps = args.steps or ((4 if args.quick else 12) if agentic or agent else (30 if args.quick else 70))
    default_roles = (*DEFAULT_ROLES, *SESSION_ROLES) if agentic else AGENT_ROLES if agent else DEFAULT_ROLES
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip()) if args.roles else default_roles
    root = args.root or Path(tempfile.mkdtemp(prefix="psrl-chaos-"))
    preset, workload = WORKLOADS[args.workload]
    curve = ["bus.curve=on"] if args.curve else []
    overrides = [*workload, f"trainer.total_steps={steps}", *curve, *args.overrides]
    if args.elastic > 0 and not any(o.startswith("topology.max_rollout_instances=") for o in args.overrides):
        started = load_config(preset, overrides).topology.n_rollout_instances
        overrides.append(f"topology.max_rollout_instances={started + 2}")  # room to scale up into
    config = checked(load_config(preset, overrides))
    plan = Plan(roles, args.faults or faults, args.gap, args.anchored, args.plan, args.elastic)
    results = []
    for k in range(args.cases or cases):
        case = run_case(args.seed + k, config, plan, root, args.case_deadline, replay=agent)
        print(describe(case), flush=True)
        results.append(case)
        if case.exit_code == EXIT_INTERRUPTED:  # Ctrl-C or SIGTERM stops the harness, not just a case
            break
    print(f"run directories: {root}")
    print("recovery (signal -> replacement Ready) by role:")
    for line in role_lines(results):
        print(line)
    print(summary_line(results))


if __name__ == "__main__":
    main()
