"""The wheel as a user gets it: built, installed in a fresh virtual environment, used from outside
the repository (presets, the demo model, the kernels' C sources and the example all work).

Regression: `pip wheel .` left out configs/, so `psrl config show demo` and `psrl launch` failed
from a non-editable install. Slow (installs torch into a new environment): `make test-wheel`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(2400)]  # installs torch into a new venv

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PSRL_CONFIG_DIR", "VIRTUAL_ENV")}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with psrl installed from its wheel; returns its bin directory."""
    base = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"),
         str(ROOT)], cwd=base)  # fmt: skip
    (wheel,) = (base / "dist").glob("psrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for packaged in ("psrl/presets/demo.yaml", "psrl/assets/demo_model/model.safetensors",
                     "psrl/kernels/decode_cpu.c", "psrl/sim/demo_cost_model.json"):  # fmt: skip
        assert packaged in names, packaged
    run([sys.executable, "-m", "venv", str(base / "venv")], cwd=base)
    bin_dir = base / "venv" / "bin"
    run(
        [str(bin_dir / "pip"), "install", "-q", "-c", str(ROOT / "constraints.txt"), str(wheel)], cwd=base, timeout=1800
    )
    return bin_dir


def test_presets_and_config_show_work_outside_the_repository(installed: Path, tmp_path: Path) -> None:
    location = run([str(installed / "python"), "-c", "import psrl; print(psrl.__file__)"], cwd=tmp_path).stdout
    assert str(ROOT) not in location and "site-packages" in location
    assert "demo" in run([str(installed / "psrl"), "config", "presets"], cwd=tmp_path).stdout.split()
    shown = run([str(installed / "psrl"), "config", "show", "demo"], cwd=tmp_path).stdout
    assert "name: demo_short" in shown


def test_the_example_launches_from_a_wheel_install(installed: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples" / "digits", tmp_path / "digits")
    short = ["trainer.total_steps=2", "psrl.staleness_buffer_entries=4", "actor.ppo_mini_batch_size=2"]
    run([str(installed / "psrl"), "config", "show", "digits/config.yaml", *short], cwd=tmp_path)
    out = run([str(installed / "psrl"), "launch", "digits/config.yaml", *short, "--root", "runs", "--name", "ex",
               "--quiet"], cwd=tmp_path).stdout  # fmt: skip
    assert "run ex finished" in out
    checkpoint = tmp_path / "runs" / "ex" / "checkpoints" / "step_00000002" / "policy"
    assert (checkpoint / "tokenizer.json").is_file() and (checkpoint / "model.safetensors").is_file()
    metrics = (tmp_path / "runs" / "ex" / "metrics.jsonl").read_text()
    assert "reward/num_scored" in metrics, "the example's reward file scored the responses"


def test_the_python_api_runs_from_a_wheel_install(installed: Path, tmp_path: Path) -> None:
    script = (
        "import psrl\n"
        "result = psrl.run('demo', ['trainer.total_steps=2', 'psrl.staleness_buffer_entries=4',\n"
        "                  'actor.ppo_mini_batch_size=2'], name='api', root='runs')\n"
        "assert result.ok, result.reason\n"
        "print('steps', sorted({r['step'] for r in result.metrics() if r['sender'] == 'coordinator'}))\n"
    )
    assert "steps [1, 2" in run([str(installed / "python"), "-c", script], cwd=tmp_path).stdout
