"""`psrl launch --cluster` refuses what cannot run before anything starts: exit 2, the problem, the fix."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from launch.cli import launch


def run_cli(*args: str, tmp_path) -> tuple[int, str]:
    result = CliRunner().invoke(launch, ["demo", *args, "--root", str(tmp_path / "runs"), "--quiet"])
    return result.exit_code, result.output


def test_no_ray_cluster_at_the_address(tmp_path) -> None:
    pytest.importorskip("ray")
    code, out = run_cli("--cluster", "ray:127.0.0.1:1", tmp_path=tmp_path)
    assert code == 2, out
    assert "no Ray cluster at 127.0.0.1:1" in out and "ray start --head" in out
    assert not (tmp_path / "runs").exists()


def test_ray_without_the_extra_names_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the ray extra were not installed
    code, out = run_cli("--cluster", "ray", tmp_path=tmp_path)
    assert code == 2, out
    assert "--cluster ray needs the optional package 'ray'" in out and "pip install -e '.[ray]'" in out


def test_slurm_outside_an_allocation(tmp_path, monkeypatch) -> None:
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    code, out = run_cli("--cluster", "slurm", tmp_path=tmp_path)
    assert code == 2, out
    assert "not a Slurm allocation" in out and "sbatch" in out


def test_hosts_and_cluster_together_and_a_bad_cluster_name(tmp_path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("a 127.0.0.1 coordinator router logger trainer ps rollout local=true\n")
    code, out = run_cli("--hosts", str(hosts), "--cluster", "slurm", tmp_path=tmp_path)
    assert code == 2 and "--hosts and --cluster (topology.cluster) both place the actors" in out, out
    code, out = run_cli("--cluster", "kube", tmp_path=tmp_path)
    assert code == 2 and "topology.cluster = 'kube'" in out, out


def test_the_python_api_follows_topology_cluster(tmp_path, monkeypatch) -> None:
    """psrl.run with topology.cluster set goes to the cluster, never silently to this machine."""
    from launch.api import run
    from launch.cluster import ClusterError

    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ClusterError, match="not a Slurm allocation"):
        run("demo", ["topology.cluster=slurm"], root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
