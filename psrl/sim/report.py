"""Console tables of simulated runs and of validations."""

from __future__ import annotations

from collections.abc import Sequence

from psrl.sim.stats import SimSummary, staleness_text
from psrl.sim.validate import Validation

_HEADER = (
    f"{'run':<38} {'traj/s':>9} {'tokens/s':>10} {'busy':>5} {'pull':>5} {'tr.idle':>7} {'staleness':<18} "
    f"{'wasted':>7} {'loops':>5} {'syncs':>6} {'migr':>5} {'viol':>4} {'wall s':>6}"
)


def summary_table(rows: Sequence[SimSummary]) -> list[str]:
    """One line per run: throughput, utilisation, staleness shares, waste, and the bound check."""
    lines = [_HEADER]
    for r in rows:
        lines.append(
            f"{r.label[:38]:<38} {r.trajectories_per_s:>9.2f} {r.tokens_per_s:>10.0f} {r.instance_busy:>5.0%} "
            f"{r.instance_syncing:>5.1%} {r.trainer_idle:>7.0%} {staleness_text(r.staleness):<18} "
            f"{r.wasted_fraction:>7.1%} {r.loopbacks_per_request:>5.2f} {r.num_syncs:>6} {r.num_migrations:>5} "
            f"{r.num_bound_violations:>4} "
            f"{r.wall_s:>6.1f}"
        )
    return lines


def legend() -> str:
    return (
        "traj/s, tokens/s: trained per second (steps 2..K); busy: instance time prefilling or decoding; "
        "pull: instance time pulling weights; tr.idle: trainer time without work; staleness: share of "
        "trained trajectories per (buffer - V_traj); wasted: generated tokens thrown away; loops: partial-rollout "
        "loopbacks per request; syncs: weight pulls; migr: migrations; viol: staleness "
        "bound violations (own check + token versions + ledger), 0 expected"
    )


def validation_table(validations: Sequence[Validation]) -> list[str]:
    """Steady throughput (steps 2..K) and the work-window figure of ``psrl report``, measured vs simulated."""
    lines = [
        f"{'run':<22} {'steady traj/s meas | sim':>25} {'ratio':>6}  {'window traj/s meas | sim':>25} {'ratio':>6}  "
        f"{'train s/step meas | sim':>23}  {'wait s/step meas | sim':>23}"
    ]
    for v in validations:
        s, m, w = v.summary, v.measured, v.simulated
        lines.append(
            f"{s.label[:22]:<22} {v.measured_per_s:>15.2f} | {s.trajectories_per_s:<7.2f} {v.ratio:>6.3f}  "
            f"{v.measured_window_per_s:>15.2f} | {s.window_trajectories_per_s:<7.2f} {v.window_ratio:>6.3f}  "
            f"{m.train_s:>13.3f} | {w.train_s:<7.3f}  {m.wait_s:>13.3f} | {w.wait_s:<7.3f}"
        )
    return lines
