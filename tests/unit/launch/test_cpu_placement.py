"""topology.cpu_placement: the trainer gets the cores the other actors leave free, they get the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from launch.cpu_placement import CorePlan, CpuPlacement, pin, places_cores, plan_cores
from psrl.config import load_config
from psrl.errors import ConfigError
from psrl.preflight import cpu_placement_host


def test_the_trainer_gets_what_the_others_leave_and_they_keep_a_core() -> None:
    assert plan_cores([0, 1], others_busy=0.7, outside_busy=0.0) == CorePlan((0,), (1,))  # the demo
    assert plan_cores(range(8), others_busy=2.6, outside_busy=0.1) == CorePlan((0, 1, 2, 3, 4), (5, 6, 7))
    assert plan_cores([0, 1], others_busy=1.8, outside_busy=0.0) == CorePlan((0,), (1,))  # at least one each


def test_no_plan_where_the_others_hardly_run_the_host_is_shared_or_one_core() -> None:
    assert plan_cores([0, 1], others_busy=0.3, outside_busy=0.0) is None  # the trainer takes both, shared
    assert plan_cores([0, 1], others_busy=0.7, outside_busy=0.9) is None  # another job: every core to all
    assert plan_cores([0, 1], others_busy=0.7, outside_busy=0.9, yields_to_others=False) == CorePlan((0,), (1,))
    assert plan_cores([3], others_busy=0.0, outside_busy=0.0) is None


def test_placement_applies_to_one_local_cpu_trainer_only() -> None:
    cpu = load_config("demo", ["topology.device=cpu"])
    assert places_cores(cpu, is_local=True)
    assert not places_cores(cpu, is_local=False)
    assert not places_cores(load_config("demo", ["topology.device=cpu", "topology.cpu_placement=off"]), True)
    assert not places_cores(load_config("demo", ["topology.device=cpu", "topology.n_trainer_ranks=2"]), True)
    assert not places_cores(load_config("demo", ["topology.device=cuda"]), True)
    for pinned_threads in ("topology.trainer_threads=2", "topology.threads_per_actor=2", "engine.backend=vllm"):
        assert not places_cores(load_config("demo", ["topology.device=cpu", pinned_threads]), True)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_plan_pins_every_thread_and_a_release_gives_the_cores_back() -> None:
    cores = sorted(os.sched_getaffinity(0))
    spin = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)"
    trainer, other = (subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2))
    try:
        time.sleep(0.5)  # its second thread is up
        placement = CpuPlacement(log=None)
        placement.cores = cores
        placement._apply(CorePlan((cores[0],), tuple(cores[1:])), trainer.pid, [other.pid])
        placement.plan = CorePlan((cores[0],), tuple(cores[1:]))
        for task in os.listdir(f"/proc/{trainer.pid}/task"):
            assert os.sched_getaffinity(int(task)) == {cores[0]}
        assert os.sched_getaffinity(other.pid) == set(cores[1:])
        placement._apply(None, trainer.pid, [other.pid])
        assert os.sched_getaffinity(trainer.pid) == set(cores) == os.sched_getaffinity(other.pid)
        assert not pin(999_999_999, cores)  # a process that is gone
    finally:
        for child in (trainer, other):
            child.kill()
            child.wait()


def test_a_split_near_its_boundary_is_kept() -> None:
    """Others measured at 0.46 then 0.58 cores must not flip the trainer between one core and two."""
    one = CorePlan((0,), (1,))
    assert plan_cores([0, 1], others_busy=0.46, outside_busy=0.0, current=one) == one
    assert plan_cores([0, 1], others_busy=0.58, outside_busy=0.0, current=None) is None
    assert plan_cores([0, 1], others_busy=0.3, outside_busy=0.0, current=one) is None  # well past it


def test_a_plan_in_force_survives_one_noisy_sample_of_outside_work() -> None:
    one = CorePlan((0,), (1,))
    assert plan_cores([0, 1], others_busy=0.7, outside_busy=0.35, current=None) is None
    assert plan_cores([0, 1], others_busy=0.7, outside_busy=0.35, current=one) == one
    assert plan_cores([0, 1], others_busy=0.7, outside_busy=0.6, current=one) is None  # another job, for real


def test_placement_switched_on_where_it_cannot_apply_is_refused_before_launch() -> None:
    for blocker in ("topology.trainer_threads=2", "topology.threads_per_actor=2", "topology.n_trainer_ranks=2",
                    "engine.backend=vllm", "topology.cluster=ray"):  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            load_config("demo", ["topology.device=cpu", "topology.cpu_placement=on", blocker])
        [problem] = refused.value.problems
        assert problem.paths == ("topology.cpu_placement", blocker.split("=")[0]), problem
    assert places_cores(load_config("demo", ["topology.device=cpu", "topology.cpu_placement=on"]), True)
    [across] = list(cpu_placement_host(load_config("demo", ["topology.cpu_placement=on"]), spans_hosts=True))
    assert across.paths == ("topology.cpu_placement",)
    assert not list(cpu_placement_host(load_config("demo", ["topology.cpu_placement=auto"]), spans_hosts=True))
