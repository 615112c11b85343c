"""The shard's version state machine: double buffering, incarnations, two-phase commit."""

from __future__ import annotations

from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PushBegin
from psrl.ps.versions import NONE, ShardVersions


def entry(index: int, shard: int = 0) -> ManifestEntry:
    return ManifestEntry(index, f"t{index}", (4,), "float32", shard, 0, 4, 64 * index, 16, 1000 + index)


def begin(version: int, incarnation: int = 1, attempt: int = 1, entries: int = 2, shard: int = 0) -> PushBegin:
    items = tuple(entry(i, shard) for i in range(entries))
    return PushBegin(version, incarnation, attempt, b"d%d" % version, 1, entries, "xxh3_64", items)


def land_all(state: ShardVersions[str], message: PushBegin) -> None:
    state.begin(message, f"buf{message.version}")
    for e in message.entries:
        assert not isinstance(state.match_chunk(message.version, message.incarnation, message.attempt, e.index), str)
        state.mark_landed(e.index)
    state.finalize(message.entries, f"served{message.version}")


def committed(state: ShardVersions[str], version: int, incarnation: int = 1) -> ShardVersions[str]:
    land_all(state, begin(version, incarnation))
    assert state.commit(version, incarnation).is_ok
    return state


class TestDoubleBuffering:
    def test_keeps_latest_and_previous_and_retires_older(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        committed(state, 1)
        committed(state, 2)
        land_all(state, begin(3))
        outcome = state.commit(3, 1)
        assert outcome.retired is not None and outcome.retired.version == 1
        assert (state.latest_version, state.previous_version) == (3, 2)
        assert state.lookup(1) is None
        assert state.lookup(2) is not None and state.lookup(-1) is state.latest

    def test_incoming_push_does_not_touch_readable_versions(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        committed(state, 1)
        committed(state, 2)
        state.begin(begin(3), "buf3")
        assert state.lookup(1) is not None and state.lookup(2) is not None
        assert state.lookup(3) is None  # not readable before its commit


class TestPushRules:
    def test_stale_incarnation_is_refused_at_begin_and_commit(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        committed(state, 1, incarnation=5)
        reason = state.check_begin(begin(2, incarnation=4))
        assert reason is not None and "stale trainer incarnation" in reason
        assert not state.commit(2, 4).is_ok

    def test_newer_incarnation_replaces_an_unfinished_push(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        state.begin(begin(3, incarnation=1), "old")
        assert state.check_begin(begin(3, incarnation=2)) is None
        replaced = state.begin(begin(3, incarnation=2), "new")
        assert replaced is not None and replaced.buffers == "old"
        assert isinstance(state.match_chunk(3, 1, 1, 0), str)  # old incarnation's chunks are dropped
        assert not state.commit(3, 1).is_ok

    def test_committed_versions_are_immutable(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        committed(state, 4)
        for version in (3, 4):
            reason = state.check_begin(begin(version))
            assert reason is not None and "not newer" in reason

    def test_retry_attempt_restarts_and_drops_old_chunks(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        state.begin(begin(1, attempt=1), "a1")
        state.mark_landed(0)
        assert state.check_begin(begin(1, attempt=2)) is None
        state.begin(begin(1, attempt=2), "a2")
        assert isinstance(state.match_chunk(1, 1, 1, 1), str)
        assert not isinstance(state.match_chunk(1, 1, 2, 0), str)
        assert state.check_begin(begin(1, attempt=1)) is not None  # an older attempt arriving late

    def test_commit_needs_every_entry_landed_and_finalized(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        state.begin(begin(1), "buf")
        state.mark_landed(0)
        assert not state.commit(1, 1).is_ok
        state.mark_landed(1)
        assert not state.commit(1, 1).is_ok  # landed but not finalized
        state.finalize(begin(1).entries, "served")
        assert state.commit(1, 1).is_ok

    def test_commit_is_idempotent_for_the_latest_version(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        committed(state, 1)
        again = state.commit(1, 1)
        assert again.is_ok and not again.is_new and again.retired is None

    def test_duplicate_chunks_and_foreign_entries_are_dropped(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 2)
        state.begin(begin(1, entries=2), "buf")
        state.mark_landed(0)
        assert isinstance(state.match_chunk(1, 1, 1, 0), str)
        assert isinstance(state.match_chunk(1, 1, 1, 9), str)

    def test_entries_of_another_shard_or_layout_are_refused(self) -> None:
        state: ShardVersions[str] = ShardVersions(1, 2)
        wrong_shard = PushBegin(1, 1, 1, b"d", 2, 1, "xxh3_64", (entry(0, shard=0),))
        wrong_count = PushBegin(1, 1, 1, b"d", 3, 1, "xxh3_64", (entry(0, shard=1),))
        assert state.check_begin(wrong_shard) is not None
        assert state.check_begin(wrong_count) is not None

    def test_empty_state_reports_none(self) -> None:
        state: ShardVersions[str] = ShardVersions(0, 1)
        assert (state.latest_version, state.previous_version, state.incoming_version) == (NONE, NONE, NONE)
        assert state.lookup(-1) is None
