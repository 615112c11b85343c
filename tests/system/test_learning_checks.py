"""A real run with held-out evaluation: eval metrics with their versions, evaluation traffic outside the
staleness ledger, and ``psrl replay --check staleness`` (agrees on the run, fails on an altered log)."""

from __future__ import annotations

import shutil

import msgspec
import numpy as np
import pytest

import psrl
from bus.codec import Decoder, Encoder
from bus.eventlog.reader import EventLogReader
from bus.eventlog.writer import EventLogWriter
from bus.messages import EvalRequest, GenerateRequest, LedgerOp, Occupy, StalenessCertificate
from psrl.config import load_config
from psrl.replay.runner import replay_run
from psrl.report.tensorboard import read_scalars

pytestmark = pytest.mark.system

OVERRIDES = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "trainer.total_steps=3",
             "trainer.eval_interval=2", "eval.num_prompts=8", "eval.k=2"]  # fmt: skip


def altered_copy(run, target):
    """The run's config and event log, with the first certificate's first V_traj changed (every other record
    byte for byte)."""
    target.mkdir()
    shutil.copy(run / "config.yaml", target / "config.yaml")
    writer, decoder, encoder, altered = EventLogWriter(target / "events"), Decoder(), Encoder(), False
    for record in EventLogReader(run / "events").records():
        (first, *rest) = decoder.decode(record.frames)
        if isinstance(first.message, StalenessCertificate) and not rest and not altered:
            v_traj = first.message.v_traj.copy()
            v_traj[0] -= 1
            writer.append(encoder.encode(first.envelope, msgspec.structs.replace(first.message, v_traj=v_traj)))
            altered = True
        else:
            writer.append(record.frames)
    writer.close()
    assert altered


def test_evaluation_and_the_staleness_certificate_in_a_real_run(tmp_path) -> None:
    config = load_config("demo", OVERRIDES)
    result = psrl.run("demo", OVERRIDES, name="learn", root=tmp_path / "runs")
    assert result.ok, result.reason
    run = result.run_dir
    evals = [r for r in result.metrics() if "eval/acc" in r["values"]]  # metrics.jsonl
    assert [int(r["values"]["eval/version"]) for r in evals] == [0, 2, 3]
    assert all(r["model_version"] == r["step"] == r["values"]["eval/version"] for r in evals)
    assert [p.step for p in read_scalars(run / "tb" / "coordinator")["eval/acc"]] == [0, 2, 3]  # TensorBoard
    assert (run / "report" / "eval.png").is_file() and (run / "report" / "certificates.png").is_file()

    events = [e.event.message for e in EventLogReader(run / "events").events()]
    generated = [m for m in events if isinstance(m, GenerateRequest)]
    training_prompts = {m.prompt_id for m in generated}
    held_out = {tuple(m.prompt_token_ids.tolist()) for m in events if isinstance(m, EvalRequest)}
    assert held_out and len([m for m in events if isinstance(m, EvalRequest)]) == 3
    assert not held_out & {tuple(m.prompt_token_ids.tolist()) for m in generated}  # no held-out prompt trained
    ledger = {m.prompt_id for m in events if isinstance(m, LedgerOp | Occupy)}
    assert ledger and ledger <= training_prompts
    certificates = [m for m in events if isinstance(m, StalenessCertificate)]
    assert [c.buffer for c in certificates] == [0, 1, 2]
    assert all({int(r) // 4 for r in c.request_ids} <= training_prompts for c in certificates)
    assert all(np.all(c.buffer - c.v_traj <= config.psrl.staleness) for c in certificates)

    (check,) = replay_run(run, ["staleness"]).checkers
    assert check.agreement.num_agree == 3 and check.agreement.num_disagree == 0, check.agreement.disagreements
    altered_copy(run, tmp_path / "altered")
    (check,) = replay_run(tmp_path / "altered", ["staleness"]).checkers
    assert check.agreement.num_disagree == 1 and check.agreement.num_agree == 2
