"""topology.trainer_threads=auto: the trainer takes the cores the other processes left idle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from psrl.cpu_usage import host_busy_seconds
from psrl.trainer.threads import RETRY_AFTER, CpuSample, CpuSampler, ThreadTrials, threads_for

TICK = os.sysconf("SC_CLK_TCK")


def test_a_saturated_host_keeps_one_thread_and_an_idle_one_gives_its_cores() -> None:
    # the demo on 2 cores: the other actors keep 1.2 cores busy
    assert threads_for(2, wall_s=10.0, host_busy_s=20.0, own_cpu_s=8.0) == 1
    # SmolLM2 with short answers: the rollout keeps 0.3 of a core busy
    assert threads_for(2, wall_s=10.0, host_busy_s=13.0, own_cpu_s=10.0) == 2
    assert threads_for(16, wall_s=1.0, host_busy_s=5.0, own_cpu_s=1.0) == 12
    assert threads_for(16, wall_s=1.0, host_busy_s=40.0, own_cpu_s=1.0) == 1  # busier than the cores
    assert threads_for(4, wall_s=0.0, host_busy_s=0.0, own_cpu_s=0.0) == 1


def test_the_trainers_own_time_is_not_counted_against_it() -> None:
    """A trainer that used both cores itself still finds them free next time (no oscillation)."""
    assert threads_for(2, wall_s=10.0, host_busy_s=20.0, own_cpu_s=19.0) == 2


def test_busy_time_is_read_from_the_aggregate_line() -> None:
    stat = f"cpu  {TICK * 3} 0 {TICK} {TICK * 50} {TICK * 2} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
    assert host_busy_seconds(stat) == pytest.approx(4.0)  # user + system; idle and iowait are not busy
    assert host_busy_seconds("intr 1 2 3\n") is None


def _stat_of_own_cores(first_core_line: str) -> str:
    """A /proc/stat whose first core of this process's affinity has ``first_core_line``'s ticks, the rest idle."""
    first, *rest = sorted(os.sched_getaffinity(0))
    idle = "".join(f"cpu{core} 0 0 0 {TICK * 100} 0 0 0 0\n" for core in rest)
    return f"cpu  1 2 3 4 5 6 7 8\ncpu{first} {first_core_line}\n{idle}"


def test_the_sampler_measures_between_calls(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat_of_own_cores(f"{TICK * 10} 0 0 {TICK * 100} 0 0 0 0"))
    sampler = CpuSampler(stat)
    assert sampler.is_available and sampler.num_cores >= 1
    stat.write_text(_stat_of_own_cores(f"{TICK * 13} 0 {TICK} {TICK * 100} 0 0 0 0"))
    sample = sampler.since_last()
    assert sample is not None and sample.host_busy_s == pytest.approx(4.0) and sample.wall_s > 0
    stat.unlink()
    assert sampler.since_last() is None  # no /proc/stat (not Linux): the pool is left as it is


def test_a_thread_count_near_its_boundary_is_kept() -> None:
    # others at 0.46 and 0.58 cores of 2: one thread stays one, two stay two
    assert threads_for(2, wall_s=1.0, host_busy_s=1.46, own_cpu_s=1.0, current=1) == 1
    assert threads_for(2, wall_s=1.0, host_busy_s=1.58, own_cpu_s=1.0, current=2) == 2
    assert threads_for(2, wall_s=1.0, host_busy_s=1.8, own_cpu_s=1.0, current=2) == 1  # well past it


def test_busy_time_of_some_cores_counts_only_their_lines() -> None:
    """A trainer pinned to cores 0-1 of four counts only what ran there: the others' cores are theirs."""
    stat = (f"cpu  {TICK * 9} 0 0 0 0 0 0 0\ncpu0 {TICK} 0 0 0 0 0 0 0\ncpu1 {TICK * 2} 0 0 0 0 0 0 0\n"
            f"cpu2 {TICK * 3} 0 0 0 0 0 0 0\ncpu3 {TICK * 3} 0 0 0 0 0 0 0\n")  # fmt: skip
    assert host_busy_seconds(stat, {0, 1}) == pytest.approx(3.0)
    assert host_busy_seconds(stat) == pytest.approx(9.0)
    assert host_busy_seconds(stat, {0, 7}) is None  # a core the host does not list


def test_a_move_to_other_cores_skips_one_decision(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat_of_own_cores(f"{TICK} 0 0 {TICK * 100} 0 0 0 0"))
    sampler = CpuSampler(stat)
    assert sampler._last is not None
    sampler._last.cores = frozenset({-1})  # as if read before the launcher pinned this process elsewhere
    assert sampler.since_last() is None
    assert sampler.since_last() is not None


def _interval(wall_s: float, others_busy_cores: float, own_cpu_s: float = 0.0) -> CpuSample:
    """One version's interval: ``others_busy_cores`` of the host used by the other processes."""
    return CpuSample(wall_s, own_cpu_s + others_busy_cores * wall_s, own_cpu_s, frozenset({0, 1}))


def _run(trials: ThreadTrials, step_s_of: dict[int, float], others: float, versions: int) -> list[int]:
    """The counts chosen over ``versions`` when a version takes ``step_s_of[threads]``."""
    threads, chosen = 1, []
    for version in range(1, versions + 1):
        threads = trials.decide(threads, version, _interval(step_s_of[threads], others))
        chosen.append(threads)
    return chosen


def test_one_thread_more_is_tried_and_kept_where_it_shortens_the_version() -> None:
    # SmolLM2 on the demo workload: others at 0.45 of 2 cores, 38 s a version at 1 thread, 29 s at 2
    chosen = _run(ThreadTrials(2), {1: 38.0, 2: 29.0}, others=0.45, versions=8)
    assert chosen[:3] == [1, 1, 2] and chosen[-1] == 2 and set(chosen[4:]) == {2}


def test_a_trial_that_is_slower_goes_back_and_the_verdict_stands() -> None:
    # the demo: others at 0.7, one thread better (0.314 against 0.333 s)
    trials = ThreadTrials(2)
    chosen = _run(trials, {1: 0.314, 2: 0.333}, others=0.7, versions=5 + RETRY_AFTER)
    assert chosen[2:4] == [2, 2] and chosen[4] == 1  # tried at versions 3-4, back at version 5
    assert set(chosen[5:-1]) == {1}  # the verdict stands for RETRY_AFTER versions
    assert chosen[-1] == 2 and trials.trial == (2, 1)  # then the counts are compared again


def test_no_trial_where_the_others_leave_no_room_and_a_busier_host_is_yielded_to() -> None:
    assert set(_run(ThreadTrials(2), {1: 1.0, 2: 0.5}, others=0.9, versions=10)) == {1}
    trials = ThreadTrials(2)
    _run(trials, {1: 38.0, 2: 29.0}, others=0.45, versions=6)  # settled on 2
    assert trials.decide(2, 7, _interval(29.0, others_busy_cores=1.5)) == 1
    assert trials.decide(1, 1, _interval(60.0, others_busy_cores=0.0)) == 2  # start-up: the estimate alone


def test_a_trial_whose_count_was_changed_from_outside_is_dropped() -> None:
    trials = ThreadTrials(2)
    _run(trials, {1: 0.314, 2: 0.333}, others=0.7, versions=3)  # trying 2 threads from version 3
    assert trials.trial == (2, 1)
    assert trials.decide(1, 4, _interval(0.314, others_busy_cores=0.7)) == 1 and trials.trial is None
