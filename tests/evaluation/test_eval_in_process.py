"""Held-out evaluation and the staleness certificate over whole training steps of the real flows."""

from __future__ import annotations

import numpy as np

from bus.messages import EvalRequest, GenerateRequest, Occupy, Reserve, TrajectoryFlags
from psrl.config import load_config
from psrl.flows.driver import InProcessRun
from psrl.flows.effects import Effect, Publish, Send
from psrl.tasks.demo import is_held_out

SMALL = ["psrl.staleness_buffer_entries=4", "psrl.rollout_n=4", "actor.ppo_mini_batch_size=4"]
EVAL = ["trainer.eval_interval=2", "eval.num_prompts=6", "eval.k=2"]


def test_evaluation_runs_at_due_versions_outside_the_staleness_ledger() -> None:
    config = load_config("demo", [*SMALL, *EVAL, "trainer.total_steps=4", "psrl.staleness=1"])
    run = InProcessRun(config)
    seen: list[tuple[str, Effect]] = []
    run.bus.tap = lambda sender, effect, now: seen.append((sender, effect))
    record = run.run()
    assert record.finished is not None and record.finished.success

    evals = [m for m in record.metrics if "eval/acc" in m.values]
    assert [int(m.values["eval/version"]) for m in evals] == [0, 2, 4]  # 0, every 2, and the last
    assert all(m.step == m.values["eval/version"] for m in evals)
    for m in evals:
        assert 0 <= m.values["eval/acc"] <= 1 and 0 <= m.values["eval/pass@2"] <= 1
        assert m.values["eval/num_samples"] == 6 * 3 and m.values["eval/mixed_versions"] == 0
        assert m.values["eval/mean_length"] > 0

    requests = [e.message for _, e in seen if isinstance(e, Publish) and isinstance(e.message, EvalRequest)]
    assert len(requests) == 3
    eval_prompts = {tuple(r.prompt_token_ids.tolist()) for r in requests}
    task = run.coordinator.prompts
    held_out_ids = {tuple(task.token_ids(task.held_out(config).prompt(i)).tolist()) for i in range(6)}
    # training traffic: what went to the router and what the ledger saw never carries a held-out prompt
    generated = [e.message for _, e in seen if isinstance(e, Send) and isinstance(e.message, GenerateRequest)]
    assert generated and not {tuple(g.prompt_token_ids.tolist()) for g in generated} & held_out_ids
    training_prompts = {g.prompt_id for g in generated}
    ledger = [m for _, e in seen if isinstance(m := getattr(e, "message", None), Reserve | Occupy)]
    assert ledger and {m.prompt_id for m in ledger} <= training_prompts
    assert eval_prompts  # the rounds asked for something
    # the certificate of every step covers exactly the trained trajectories, none of them evaluation's
    assert [c.buffer for c in record.certificates] == [0, 1, 2, 3]
    for cert in record.certificates:
        assert cert.version == cert.buffer + 1 and len(cert.request_ids) == 16
        assert {int(r) // 4 for r in cert.request_ids} <= training_prompts
        assert np.all(cert.buffer - cert.v_traj <= 1) and np.all(cert.v_traj <= cert.buffer)
        assert np.all(cert.max_token_version <= cert.buffer) and np.all(cert.flags >= 0)
        assert np.all((cert.is_mean > 0) & (cert.is_mean <= 2.0)) and np.all(cert.is_clipped_frac <= 1)
        assert set(np.unique(cert.flags)) <= {int(f) for f in range(8)}
    assert all(not is_held_out(task.prompt(p).text) for p in training_prompts)
    assert TrajectoryFlags.INTERRUPTED == 1
