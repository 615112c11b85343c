"""Which warm spare a replacement takes, and when spares are started (pure policy)."""

from __future__ import annotations

import re

import pytest

from launch.spare_policy import SpareInfo, SparePolicy


def spare(spare_id: int, host: str = "local", *, ready: bool = True, started_at: float = 0.0) -> SpareInfo:
    return SpareInfo(spare_id, host, ready, started_at)


def test_a_replacement_takes_the_oldest_ready_spare_on_its_own_host() -> None:
    policy = SparePolicy(per_host=3)
    spares = [spare(4), spare(2, ready=False), spare(3), spare(1, "gpu-1")]
    assert policy.pick(spares, "local") == 3
    assert policy.pick(spares, "gpu-1") == 1


def test_no_ready_spare_or_a_fresh_process_needed_means_a_cold_start() -> None:
    policy = SparePolicy(per_host=1)
    assert policy.pick([spare(1, ready=False)], "local") is None
    assert policy.pick([], "local") is None
    assert policy.pick([spare(1, "elsewhere")], "local") is None
    assert policy.pick([spare(1)], "local", needs_fresh_process=True) is None


def test_spares_start_only_while_the_run_is_settled_and_one_at_a_time_per_host() -> None:
    policy = SparePolicy(per_host=2)
    hosts = ["local", "gpu-1"]
    assert policy.hosts_to_fill([], hosts, run_settled=False) == []
    assert policy.hosts_to_fill([], hosts, run_settled=True) == hosts
    warming = [spare(1, ready=False), spare(2, "gpu-1")]
    assert policy.hosts_to_fill(warming, hosts, run_settled=True) == ["gpu-1"]
    full = [spare(1), spare(2), spare(3, "gpu-1"), spare(4, "gpu-1")]
    assert policy.hosts_to_fill(full, hosts, run_settled=True) == []


def test_zero_spares_starts_none_and_is_always_full() -> None:
    policy = SparePolicy(per_host=0)
    assert policy.hosts_to_fill([], ["local"], run_settled=True) == []
    assert policy.is_full([], ["local"])


def test_full_counts_ready_spares_only() -> None:
    policy = SparePolicy(per_host=2)
    assert not policy.is_full([spare(1), spare(2, ready=False)], ["local"])
    assert policy.is_full([spare(1), spare(2)], ["local"])
    assert not policy.is_full([spare(1), spare(2)], ["local", "gpu-1"])


def test_a_host_whose_spares_keep_dying_gets_no_more_and_is_not_waited_for() -> None:
    policy = SparePolicy(per_host=1, max_failures=2)
    policy.on_failed("local")
    assert policy.hosts_to_fill([], ["local"], run_settled=True) == ["local"]
    policy.on_ready("local")  # a success resets the count: failures must be in a row
    policy.on_failed("local")
    assert not policy.is_given_up("local")
    policy.on_failed("local")
    assert policy.is_given_up("local")
    assert policy.hosts_to_fill([], ["local"], run_settled=True) == []
    assert policy.is_full([], ["local"])


def test_a_spare_warming_past_its_timeout_is_retired() -> None:
    policy = SparePolicy(per_host=2, warmup_timeout_s=60.0)
    spares = [spare(1, ready=False, started_at=0.0), spare(2, ready=False, started_at=50.0), spare(3, started_at=0.0)]
    assert policy.overdue(spares, now=100.0) == [1]


def test_a_negative_count_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=re.escape("topology.warm_spares must be >= 0, got -1")):
        SparePolicy(per_host=-1)
