"""Who holds a stalled run's work: each rule of the diagnosis, and the restart-once-then-end policy."""

from __future__ import annotations

from psrl.reliability.stall import (
    END,
    RESTART,
    InstanceProgress,
    RouterView,
    StallFacts,
    StallWatch,
    diagnose,
)

NOW, TIMEOUT = 1000.0, 60.0


def _router(*, queued: int = 0, inflight: int = 0, versions=(5,), servable: int = 0, next_buffer: int = 5):
    return RouterView(queued, inflight, tuple(versions), servable, next_buffer, at=NOW - 1)


def _facts(router: RouterView | None, *, trained: int = 5, published: int = 5, versions=(5, 5), running=(0, 0)):
    pairs = enumerate(zip(versions, running, strict=True))
    instances = {f"rollout-{i}": InstanceProgress(v, r, NOW - 1) for i, (v, r) in pairs}
    return StallFacts(2, trained_version=trained, published_version=published, router=router, instances=instances)


def test_a_buffer_handed_over_and_not_trained_is_the_trainers() -> None:
    diagnosis = diagnose(_facts(_router(next_buffer=6)), NOW, TIMEOUT)
    assert diagnosis.holders == ("trainer-0",) and "buffer 5" in diagnosis.waits_for


def test_failing_pulls_name_the_instances_and_the_reason() -> None:
    facts = _facts(_router(queued=8))
    facts.pull_failures["rollout-1"] = "no reply from the PS within 60 s"
    diagnosis = diagnose(facts, NOW, TIMEOUT)
    assert diagnosis.holders == ("rollout-1",) and "no reply from the PS" in diagnosis.waits_for
    assert diagnosis.facts["pull_failure:rollout-1"] == "no reply from the PS within 60 s"


def test_a_router_routing_by_versions_older_than_the_instances_hold_is_the_holder() -> None:
    facts = _facts(_router(queued=384, versions=(21,), next_buffer=24), trained=24, published=24, versions=(24, 24))
    diagnosis = diagnose(facts, NOW, TIMEOUT)
    assert diagnosis.holders == ("router",)
    assert "[21]" in diagnosis.waits_for and "[24, 24]" in diagnosis.waits_for and "384" in diagnosis.waits_for
    assert diagnosis.facts["ledger_next_buffer"] == "24" and diagnosis.facts["router_queued"] == "384"


def test_instances_that_never_synced_to_a_published_version_hold_the_work() -> None:
    facts = _facts(_router(queued=16, versions=(0,), next_buffer=3), trained=3, published=3, versions=(0, 4))
    diagnosis = diagnose(facts, NOW, TIMEOUT)
    assert diagnosis.holders == ("rollout-0",) and "version >= 1" in diagnosis.waits_for


def test_requests_running_without_an_end_are_the_running_instances() -> None:
    facts = _facts(_router(inflight=6, servable=0), running=(0, 6))
    assert diagnose(facts, NOW, TIMEOUT).holders == ("rollout-1",)


def test_a_silent_router_and_an_idle_coordinator() -> None:
    assert diagnose(_facts(None), NOW, TIMEOUT).holders == ("router",)
    late = RouterView(0, 0, (5,), 0, 5, at=NOW - 2 * TIMEOUT)
    assert diagnose(_facts(late), NOW, TIMEOUT).holders == ("router",)
    assert diagnose(_facts(_router()), NOW, TIMEOUT).holders == ("coordinator",)


def test_queued_work_some_version_can_serve_waits_on_the_router() -> None:
    assert diagnose(_facts(_router(queued=4, servable=4)), NOW, TIMEOUT).holders == ("router",)


def test_queued_work_nothing_can_serve_and_nothing_running_is_a_ledger_without_room() -> None:
    """A reservation held for a group not in flight (a finished request rebuilt as alive) fills the ledger."""
    facts = _facts(_router(queued=4, versions=(8,), next_buffer=8), trained=8, published=8, versions=(8, 8))
    diagnosis = diagnose(facts, NOW, TIMEOUT)
    assert diagnosis.holders == ("router",) and "room in its staleness ledger" in diagnosis.waits_for
    assert "buffers from 8" in diagnosis.waits_for


def test_the_watch_fires_each_timeout_restarts_once_then_ends_and_a_step_resets_it() -> None:
    watch = StallWatch(TIMEOUT, _facts(_router(next_buffer=6)), last_step_at=0.0, total_steps=10)
    assert watch.check(2 * TIMEOUT - 1) is None, "the first step gets twice as long"
    first = watch.check(2 * TIMEOUT)
    assert first is not None and first[1] == RESTART and first[2] == 2 * TIMEOUT
    assert watch.check(2 * TIMEOUT + 1) is None, "once per timeout"
    second = watch.check(3 * TIMEOUT)
    assert second is not None and second[1] == END and second[2] == 3 * TIMEOUT
    watch.trained(6, 3 * TIMEOUT + 5)
    assert watch.check(4 * TIMEOUT) is None
    again = watch.check(4 * TIMEOUT + 5)
    assert again is not None and again[1] == RESTART, "a new episode gets its own restart"


def test_after_the_last_step_nothing_is_a_stall() -> None:
    watch = StallWatch(TIMEOUT, _facts(_router()), last_step_at=0.0, total_steps=10)
    watch.trained(10, 1.0)
    assert watch.check(100 * TIMEOUT) is None


def test_a_zero_timeout_never_fires_and_a_load_clears_a_pull_failure() -> None:
    watch = StallWatch(0.0, _facts(_router()), last_step_at=0.0)
    assert watch.check(1e9) is None
    watch.pull_failed("rollout-0", "refused")
    watch.loaded("rollout-0")
    assert not watch.facts.pull_failures
