"""The in-process driver: whole training steps of the real flows, engines and trainer core, no processes."""

from __future__ import annotations

from psrl.config import load_config
from psrl.flows.driver import InProcessRun

SMALL = ["psrl.staleness_buffer_entries=4", "psrl.rollout_n=4", "actor.ppo_mini_batch_size=4"]


def test_two_training_steps_run_in_process_within_the_staleness_bound() -> None:
    run = InProcessRun(load_config("demo", [*SMALL, "trainer.total_steps=3", "psrl.staleness=1"]))
    record = run.run()
    assert record.finished is not None and record.finished.success
    assert [p.version for p in record.progress] == [1, 2, 3]
    assert all(p.num_samples == 16 for p in record.progress)
    ledger = [m.values for m in record.metrics if all(k.startswith("staleness/") for k in m.values)]  # the router's
    assert len(ledger) == 3 and all(v.pop("staleness/bound_violations") == 0 for v in ledger)
    assert all(set(v) <= {"staleness/count_0", "staleness/count_1"} and sum(v.values()) == 16 for v in ledger)
    rewards = [m.values["reward/mean"] for m in record.metrics if "throughput/tokens_per_s" in m.values]
    assert len(rewards) == 3 and all(0 <= r <= 1 for r in rewards)  # the coordinator scored every buffer
    assert sorted(run.weights.versions) == [1, 2, 3]
    assert max(i.engine.weight_version for i in run.instances) >= 1  # instances synced to trained weights
