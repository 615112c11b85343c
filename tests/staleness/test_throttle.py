"""The dispatch throttle against hand-computed budgets and upstream's version rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psrl.staleness import LedgerError, dispatch_allowance, required_ps_version


def allowance(ps: int, dispatched: int, *, eta: int = 2, ahead: int = 5, per_buffer: int = 8, initial: int = 0) -> int:
    return dispatch_allowance(
        ps_version=ps,
        initial_version=initial,
        staleness=eta,
        max_dispatch_ahead=ahead,
        groups_per_buffer=per_buffer,
        num_dispatched=dispatched,
    )


def test_hand_computed_budgets() -> None:
    assert allowance(0, 0) == 24  # (0 + 1 + min(2, 5)) * 8
    assert allowance(0, 24) == 0
    assert allowance(0, 30) == 0
    assert allowance(1, 24) == 8
    assert allowance(0, 0, eta=3, ahead=1) == 16  # max_dispatch_ahead caps the staleness
    assert allowance(0, 0, eta=0) == 8  # synchronous: one buffer at a time
    assert allowance(0, 5, eta=0) == 3
    assert allowance(7, 8, initial=7, eta=0) == 0  # resumed at version 7


def test_refuses_nonsense() -> None:
    with pytest.raises(LedgerError):
        allowance(0, 0, per_buffer=0)
    with pytest.raises(LedgerError):
        allowance(0, -1)


@given(
    ps=st.integers(0, 12),
    dispatched=st.integers(0, 200),
    eta=st.integers(0, 4),
    ahead=st.integers(0, 6),
    per_buffer=st.integers(1, 9),
)
def test_matches_upstream_version_rule(ps: int, dispatched: int, eta: int, ahead: int, per_buffer: int) -> None:
    """Upstream dispatches the next group once ps >= initial + max(dispatched - ahead*B, 0) // B."""
    upstream_allows = ps >= max(dispatched - min(eta, ahead) * per_buffer, 0) // per_buffer
    assert (allowance(ps, dispatched, eta=eta, ahead=ahead, per_buffer=per_buffer) > 0) == upstream_allows
    required = required_ps_version(
        initial_version=0,
        staleness=eta,
        max_dispatch_ahead=ahead,
        groups_per_buffer=per_buffer,
        num_dispatched=dispatched,
    )
    assert (ps >= required) == upstream_allows
