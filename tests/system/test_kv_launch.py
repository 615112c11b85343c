"""The acceptance runs of the KV tier and KV transfer: the real launcher, to its exit, then replay.

``psrl launch`` with the agentic preset and the tier on, and the reasoning preset (migration on)
with KV transfer on, must each end by themselves with code 0 (a transfer thread or a NIXL agent
that held an instance's exit made the launcher wait) and ``psrl replay --check all`` must agree
with every recorded decision.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import KvTierReport, KvTransferRecord
from psrl.replay.runner import replay_run

pytest.importorskip("lmcache", reason="needs the kv extra: pip install -c constraints.txt -e '.[kv]'")
pytestmark = pytest.mark.kv

# far beyond a few steps' run on a loaded 2-core machine: a hang fails, a slow machine does not
EXIT_BOUND_S = 900
SHORT = ["trainer.total_steps=3", "psrl.lmcache.offload_size_gb=0.1"]  # the demo model: 0.1 GiB is plenty


def launch(tmp_path: Path, preset: str, overrides: list[str]) -> Path:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", preset, "--quiet", "--root", str(tmp_path),
               "--name", "run", *SHORT, *overrides]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp_path / "run"


def assert_replay_agrees(run: Path) -> None:
    for checker in replay_run(run, ["all"]).checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])


def kinds(run: Path) -> list[type]:
    return [type(e.event.message) for e in EventLogReader(run / "events").events()]


@pytest.mark.timeout(EXIT_BOUND_S + 300)
def test_reasoning_with_kv_transfer_exits_and_replays(tmp_path: Path) -> None:
    pytest.importorskip("nixl")
    transfer = "psrl.rollout_coordination.routing_strategy.kv_transfer.enable=True"
    run = launch(tmp_path, "reasoning", ["psrl.lmcache.enable=True", "psrl.lmcache.enable_p2p=True", transfer])
    assert KvTierReport in kinds(run)
    assert_replay_agrees(run)


@pytest.mark.timeout(EXIT_BOUND_S + 300)
def test_agentic_with_the_tier_exits_and_replays(tmp_path: Path) -> None:
    run = launch(tmp_path, "agentic", ["psrl.lmcache.enable=True"])
    assert KvTierReport in kinds(run) and KvTransferRecord not in kinds(run)
    assert_replay_agrees(run)
