"""LoRA through the real flows in process: the trainer's versions are adapters only, and every instance
that synced serves them merged onto its base."""

from __future__ import annotations

from psrl.config import load_config
from psrl.flows.driver import InProcessRun

SMALL = ["psrl.staleness_buffer_entries=4", "psrl.rollout_n=4", "actor.ppo_mini_batch_size=4"]
LORA = ["actor.lora.rank=8", "actor.lora.target_modules=[q_proj,v_proj]"]


def test_lora_steps_sync_adapters_to_merging_instances() -> None:
    run = InProcessRun(load_config("demo", [*SMALL, *LORA, "trainer.total_steps=3", "psrl.staleness=1"]))
    record = run.run()
    assert record.finished is not None and record.finished.success
    assert [p.version for p in record.progress] == [1, 2, 3]
    stored = run.weights.versions
    assert sorted(stored) == [1, 2, 3]
    names = {name for name, _ in stored[3]}
    assert len(names) == 2 * 2 * 4 and all(name.endswith((".lora_A", ".lora_B")) for name in names)
    synced = [i.engine for i in run.instances if i.engine.weight_version >= 1]
    assert synced, "an instance loaded a trained version"
    for engine in synced:
        assert engine.lora is not None and len(engine.lora.adapters) == 2 * 4  # q and v of 4 layers, merged
