"""The step line's generation rate and failure counts (psrl.coordination.step_counts)."""

from __future__ import annotations

import pytest

from psrl.coordination.step_counts import FailureCounts, RateMeter, failure_kind


def test_a_buffer_full_before_its_step_does_not_spike_the_rate() -> None:
    # regression: the rate was a buffer's trajectories over the time since the previous handover, so
    # buffers filled ahead of the trainer and handed over 1 ms apart read as 128,000 traj/s
    meter = RateMeter(started=0.0, window_s=10.0)
    for i in range(256):
        meter.add(i / 128, num_tokens=10)  # two buffers' worth over 2 s: 128 per second
    first, _ = meter.rates(2.0)
    second, tokens = meter.rates(2.001)
    assert first == pytest.approx(128, rel=0.01) and second == pytest.approx(first, rel=0.01)
    assert tokens == pytest.approx(10 * second)


def test_the_rate_covers_the_trailing_window_only() -> None:
    meter = RateMeter(started=0.0, window_s=2.0)
    for i in range(100):
        meter.add(i * 0.01, num_tokens=1)  # 100 in the first second, then nothing
    assert meter.rates(1.0)[0] == pytest.approx(100, rel=0.02)
    assert meter.rates(5.0) == (0.0, 0.0)


def test_failures_are_counted_by_kind_with_their_first_error() -> None:
    counts = FailureCounts()
    counts.failed("session failed: ValueError: env broke")
    counts.failed("session failed: KeyError: 'x'")
    counts.failed("engine error: out of blocks")
    values, notes = counts.take()
    assert values == {"session/num_failed": 2.0, "generation/num_failed": 1.0}
    assert notes == {
        "session/first_error": "ValueError: env broke",
        "generation/first_error": "engine error: out of blocks",
    }
    assert counts.take() == ({"session/num_failed": 0.0, "generation/num_failed": 0.0}, {})
    assert failure_kind("session failed: x") == "session" and failure_kind("aborted") == "generation"
