"""`psrl launch` with the rollout-correction family: IcePop at staleness 4 and the GSPO loss. Every
recorded decision replays (`psrl replay --check all` agrees on all of them) and each step's staleness
certificate names the correction the trainer applied."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import StalenessCertificate
from psrl.replay.runner import replay_run

pytestmark = pytest.mark.system

EXIT_BOUND_S = 600  # far beyond a few steps on a loaded 2-core machine: a hang fails, a slow machine does not
RC = "algorithm.rollout_correction."
SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo_short", "bus.handshake_timeout_s=120",
         "trainer.save_freq=0", "trainer.total_steps=4"]  # fmt: skip


def launch(root: Path, name: str, overrides: list[str]) -> Path:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(root), "--name", name,
               *SMALL, *overrides]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / name


def replays_fully(run: Path) -> None:
    command = [sys.executable, "-m", "psrl.cli.main", "replay", str(run), "--check", "all"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for checker in replay_run(run, ["all"]).checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])


def certificates(run: Path) -> list[StalenessCertificate]:
    events = (e.event.message for e in EventLogReader(run / "events").events())
    return [m for m in events if isinstance(m, StalenessCertificate)]


def test_icepop_at_staleness_4(tmp_path: Path) -> None:
    icepop = [f"{RC}rollout_is=null", f"{RC}rollout_rs=token", f"{RC}rollout_rs_threshold=5",
              f"{RC}rollout_rs_threshold_lower=0.5"]  # fmt: skip
    run = launch(tmp_path, "icepop", ["psrl.staleness=4", *icepop])
    replays_fully(run)
    certs = certificates(run)
    assert [c.buffer for c in certs] == [0, 1, 2, 3]
    for cert in certs:
        assert cert.correction == "rs=token[0.5,5]" and cert.is_threshold == 0.0
        assert cert.masked_frac is not None and len(cert.masked_frac) == len(cert.request_ids)
        assert np.all((cert.masked_frac >= 0) & (cert.masked_frac <= 1))
        assert np.all(cert.buffer - cert.v_traj <= 4)


def test_gspo(tmp_path: Path) -> None:
    run = launch(tmp_path, "gspo", ["psrl.staleness=2", "algorithm.policy_loss.loss_mode=gspo",
                                    "algorithm.loss_agg_mode=seq-mean-token-mean"])  # fmt: skip
    replays_fully(run)
    certs = certificates(run)
    assert [c.buffer for c in certs] == [0, 1, 2, 3]
    for cert in certs:
        assert cert.correction == "is=token[-,2];loss=gspo" and cert.is_threshold == 2.0
        assert cert.masked_frac is not None and np.all(np.isnan(cert.masked_frac))  # no rejection configured
