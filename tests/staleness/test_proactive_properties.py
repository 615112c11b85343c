"""Property tests of the proactive filter on its target situation: the buffer the trainer waits on
is stuck behind old stragglers while newer groups have already landed in later buffers.

Random sizes build that situation constructively (random event sequences reach it too rarely);
the outcome must then satisfy the filter's contract and every ledger invariant.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from psrl.staleness import (
    AbortReason,
    GroupState,
    LedgerSizes,
    StalenessLedger,
    check_invariants,
    proactive_retry,
    proactive_truncate,
)


def stuck_ledger(
    eta: int, ready: int, num_stragglers: int, num_later: int, *, n: int = 1, n_red: int = 1
) -> tuple[StalenessLedger, list[int], list[int]]:
    """Buffer b = eta holds `ready - num_stragglers` occupied groups and `num_stragglers` version-0
    reservations; `num_later` groups of version b completed and landed in later buffers."""
    ledger = StalenessLedger(LedgerSizes(eta, ready, ready, n, n_red), next_buffer_id=eta)
    b, prompt_id = eta, 0
    stragglers, later = [], []
    for index in range(ready):
        for child in range(n_red):
            assert ledger.reserve(prompt_id, child, 0, f"s{child}") == b
        if index < num_stragglers:
            stragglers.append(prompt_id)
        else:
            for child in range(n):
                ledger.finish_child(prompt_id, child)
            assert ledger.occupy(prompt_id).buffer_id == b
        prompt_id += 1
    for _ in range(num_later):
        if not ledger.can_reserve(prompt_id, b):
            break
        for child in range(n_red):
            ledger.reserve(prompt_id, child, b, "x")
        for child in range(n):
            ledger.finish_child(prompt_id, child)
        outcome = ledger.occupy(prompt_id)
        assert outcome.buffer_id is not None and outcome.buffer_id > b  # version-0 stragglers cannot swap
        later.append(prompt_id)
        prompt_id += 1
    check_invariants(ledger)
    return ledger, stragglers, later


@settings(max_examples=80, deadline=None)
@given(
    eta=st.integers(1, 4),
    ready=st.integers(1, 4),
    data=st.data(),
)
def test_retry_contract(eta: int, ready: int, data: st.DataObject) -> None:
    num_stragglers = data.draw(st.integers(1, ready))
    num_later = data.draw(st.integers(0, ready * eta))
    threshold = data.draw(st.integers(0, ready))
    ledger, stragglers, later = stuck_ledger(eta, ready, num_stragglers, num_later)
    b = ledger.next_buffer_id
    # Groups of a buffer that is already ready stay there (moving them would un-ready it).
    movable = [p for p in later if not ledger.is_ready(ledger.group_buffer(p) or -1)]
    outcome = proactive_retry(ledger, threshold)
    should_act = num_stragglers <= threshold and len(movable) >= num_stragglers
    assert (outcome is not None) == should_act
    check_invariants(ledger)
    if outcome is None:
        assert not ledger.is_ready(b)
        return
    assert outcome.is_buffer_ready and ledger.is_ready(b)
    assert sorted(a.prompt_id for a in outcome.aborted if a.reason == AbortReason.RETRY) == stragglers
    assert outcome.num_fresh_prompts == num_stragglers
    assert len(outcome.moved) == num_stragglers and set(outcome.moved) <= set(movable)
    consumed = ledger.consume(b)
    assert consumed.num_bound_violations == 0
    assert set(consumed.staleness_histogram) <= set(range(eta + 1))


@settings(max_examples=80, deadline=None)
@given(eta=st.integers(1, 3), ready=st.integers(1, 4), data=st.data())
def test_truncate_contract(eta: int, ready: int, data: st.DataObject) -> None:
    num_stragglers = data.draw(st.integers(1, ready))
    threshold = data.draw(st.integers(0, ready))
    ledger, stragglers, _ = stuck_ledger(eta, ready, num_stragglers, 0, n=2, n_red=3)
    finished = data.draw(st.lists(st.booleans(), min_size=len(stragglers), max_size=len(stragglers)))
    for prompt_id, has_one_finished in zip(stragglers, finished, strict=True):
        if has_one_finished:
            ledger.finish_child(prompt_id, 2)
    b = ledger.next_buffer_id
    outcome = proactive_truncate(ledger, threshold)
    assert (outcome is not None) == (num_stragglers <= threshold)
    check_invariants(ledger)
    if outcome is None:
        return
    assert outcome.is_buffer_ready
    assert sorted(g.prompt_id for g in outcome.groups) == stragglers
    for group, has_one_finished in zip(sorted(outcome.groups, key=lambda g: g.prompt_id), finished, strict=True):
        assert len(group.winners) == 2
        assert len(group.truncated) == (1 if has_one_finished else 2)
        assert (2 in group.winners) == has_one_finished
        assert {ref.child for ref in group.truncated} | {ref.child for ref in group.surplus} | set(group.winners) == {
            0,
            1,
            2,
        }
        assert ledger.group_state(group.prompt_id) == GroupState.OCCUPIED
    consumed = ledger.consume(b)
    assert consumed.num_bound_violations == 0
