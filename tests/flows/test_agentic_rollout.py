"""The agent workload on the rollout side (tools/bench_agentic.py): real router, session scheduler and
engines on the wall clock; its event log replays with every recorded decision agreeing, sticky
placement reuses what balancing re-prefills, and the tiny model's output says why the profile
cannot win there."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from psrl.replay import replay_run
from tools.agentic_rollout import AgentRollout
from tools.bench_agentic import DRY_RUN, build_engines, setting_config, write_model

ROOT = Path(__file__).resolve().parents[2]


def _args() -> argparse.Namespace:
    return argparse.Namespace(overrides=[], device="cpu", tier_store="host")


def test_an_agentic_rollout_finishes_sessions_and_its_log_replays_in_full(tmp_path: Path) -> None:
    scale = replace(DRY_RUN, workload=replace(DRY_RUN.workload, sessions=4, turns=(2, 3)))
    model = write_model(scale, "cpu", tmp_path / "model")
    config = setting_config(scale, "thunder", _args(), model)
    engines = build_engines(config)
    outcome = AgentRollout(config, scale.workload, engines, log_dir=tmp_path / "log", record_steps=True).run(4.0)
    assert outcome.turns > 0 and outcome.sessions > 0 and outcome.failed_sessions == 0
    assert outcome.hit_tokens > 0 and 0 < outcome.reuse_of_perfect <= 1.0
    assert all(not e.has_unfinished_requests() for e in engines)  # emptied for the next setting
    # the step trace accounts for the engines' work: every prefilled token that was not a prefix-cache hit
    prefilled = sum(step.prefill_tokens for step in outcome.steps)
    assert prefilled == outcome.queried_tokens - outcome.hit_tokens
    assert sum(step.decode_tokens for step in outcome.steps) > 0 and all(s.seconds > 0 for s in outcome.steps)
    assert all(s.attended >= s.prefill_tokens for s in outcome.steps)  # each new token attends to itself at least
    report = replay_run(tmp_path / "log", ["all"])
    checked = {c.name: c.agreement for c in report.checkers}
    assert checked["routing"].num_decisions > 0 and checked["sessions"].num_decisions > 0
    assert all(a.num_disagree == 0 for a in checked.values())


@pytest.mark.slow
def test_sticky_placement_reuses_what_balancing_re_prefills(tmp_path: Path) -> None:
    scale = replace(DRY_RUN, workload=replace(DRY_RUN.workload, turns=(4, 6)))
    model = write_model(scale, "cpu", tmp_path / "model")
    engines = build_engines(setting_config(scale, "balance", _args(), model))
    reuse = {}
    for name in ("balance", "sticky"):
        config = setting_config(scale, name, _args(), model)
        reuse[name] = AgentRollout(config, scale.workload, engines).run(8.0).reuse_of_perfect
    # balancing sends about half the turns to the other instance, which holds at most an older prefix
    assert reuse["sticky"] > 0.85 and reuse["balance"] < reuse["sticky"] - 0.1


@pytest.mark.slow
def test_the_tiny_model_run_says_why_the_profile_cannot_win_there() -> None:
    command = [sys.executable, "tools/bench_agentic.py", "--scale", "cpu", "--budget-s", "3", "--settings",
               "balance,sticky"]  # fmt: skip
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True).stdout
    assert "the profile cannot win much on this cpu scale" in out and "decode steps" in out
    assert out.strip().splitlines()[-1].startswith("RESULT agentic_speedup_vs_balance=")


@pytest.mark.slow
def test_the_gpu_scale_path_runs_on_cpu_with_every_setting_replaying_in_full(tmp_path: Path) -> None:
    command = [sys.executable, "tools/bench_agentic.py", "--scale", "gpu", "--dry-run-cpu", "--budget-s", "4",
               "--kv-blocks", "72", "--log-dir", str(tmp_path / "logs")]  # fmt: skip
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True).stdout
    replays = [line for line in out.splitlines() if line.startswith("replay ")]
    assert len(replays) == 4 and all(" judged decisions agree" in line for line in replays)
    for line in replays:
        agreed, judged = line.split(": ", 1)[1].split(" ", 1)[0].split("/")
        assert agreed == judged and int(judged) > 0
    result = out.strip().splitlines()[-1]
    assert result.startswith("RESULT agentic_speedup_vs_balance=") and "tier_speedup=nan" not in result
