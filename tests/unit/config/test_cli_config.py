import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from psrl.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0 and "psrl, version" in result.output


def test_show_prints_resolved_yaml() -> None:
    result = run("config", "show", "psrl.staleness=2")
    assert result.exit_code == 0
    assert "staleness: 2" in result.output and "method: request_num_balance" in result.output


def test_show_refuses_typo_with_suggestion() -> None:
    result = run("config", "show", "psrl.stalenes=2")
    assert result.exit_code != 0
    assert "psrl.staleness" in result.output


def test_show_with_preset() -> None:
    result = run("config", "show", "demo", "psrl.staleness=1")
    assert result.exit_code == 0 and "staleness: 1" in result.output and "adv_estimator: grpo" in result.output


def test_committed_configuration_docs_are_current() -> None:
    from psrl.config.docs import render

    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == render(), "docs/configuration.md is stale: run `psrl config docs`"


def test_docs_list_every_leaf_field() -> None:
    from psrl.config.docs import render
    from psrl.config.loader import schema_paths

    text = render()
    for path, is_section in schema_paths().items():
        if not is_section:
            assert f"`{path}`" in text, path


def test_console_script_runs_in_a_subprocess() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "psrl.cli.main", "config", "show", "psrl.staleness=2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "staleness: 2" in out.stdout
