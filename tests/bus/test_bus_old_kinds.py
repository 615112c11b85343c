"""Logs written before protocol 1.12: ``group.complete`` reads as the kind that replaced it in each
direction, ``gen.chunk`` is dropped with the reason."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bus.codec import Decoder
from bus.errors import DecodeError, DropReason
from bus.eventlog import EventLogReader, EventLogWriter
from bus.messages import GroupAccept, GroupFinished
from bus.schema import CATALOGUE, Envelope


def _old_frames(kind: str, sender: str, message: list[object], seq: int = 1) -> list[bytes]:
    """An event as a protocol 1.11 actor encoded it: ``[kind, [[envelope, message]]]``."""
    envelope = Envelope(kind, 1, sender, 0, seq, 10, 20, parent="router#0:3", prompt_id=7)
    return [kind.encode(), msgspec.msgpack.encode([[envelope, message]])]


def test_the_removed_kinds_are_gone_from_the_catalogue() -> None:
    assert not {"group.complete", "gen.chunk"} & set(CATALOGUE)
    assert CATALOGUE["group.finished"] is GroupFinished and CATALOGUE["group.accept"] is GroupAccept


def test_an_old_group_complete_from_the_router_reads_as_group_finished() -> None:
    [event] = Decoder().decode(_old_frames("group.complete", "router.link", [7, [14, 15], 2]))
    assert event.kind == "group.finished" and event.envelope.sender == "router.link"
    assert event.message == GroupFinished(prompt_id=7, request_ids=[14, 15], occupied_buffer=2)
    assert (event.envelope.seq, event.envelope.parent, event.envelope.prompt_id) == (1, "router#0:3", 7)
    [plain] = Decoder().decode(_old_frames("group.complete", "router", [7, [14, 15]]))
    assert plain.message == GroupFinished(prompt_id=7, request_ids=[14, 15])


def test_an_old_group_complete_from_the_coordinator_reads_as_group_accept() -> None:
    [event] = Decoder().decode(_old_frames("group.complete", "coordinator.link", [7, [14, 15]]))
    assert event.kind == "group.accept" and event.message == GroupAccept(prompt_id=7, request_ids=[14, 15])


def test_an_old_group_complete_of_another_sender_and_gen_chunk_are_refused_with_why() -> None:
    with pytest.raises(DecodeError, match=r"neither group\.finished nor group\.accept") as caught:
        Decoder().decode(_old_frames("group.complete", "trainer-0", [7, [14, 15]]))
    assert caught.value.reason is DropReason.UNKNOWN_KIND
    with pytest.raises(DecodeError, match=r"removed in protocol 1\.12") as caught:
        Decoder().decode(_old_frames("gen.chunk", "rollout-0", [1, [], [], [], "i0"]))
    assert caught.value.reason is DropReason.UNKNOWN_KIND
    with pytest.raises(DecodeError, match="not in the catalogue"):
        Decoder().decode(_old_frames("group.nonsense", "router", [7]))


def test_an_old_log_replays_with_the_new_kinds_and_names_what_it_dropped(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path)
    writer.append(_old_frames("group.complete", "router.link", [7, [14, 15]], seq=1))
    writer.append(_old_frames("group.complete", "coordinator.link", [7, [14, 15]], seq=1))
    writer.append(_old_frames("gen.chunk", "rollout-0", [1, [], [], [], "i0"], seq=1))
    writer.close()
    reader = EventLogReader(tmp_path)
    assert [logged.event.kind for logged in reader.events()] == ["group.finished", "group.accept"]
    [problem] = reader.problems
    assert "gen.chunk" in problem.reason and "removed in protocol 1.12" in problem.reason
