"""Schema versions: old events are upgraded on read, newer ones refused, appended fields tolerated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import msgspec
import pytest

from bus import upgrade
from bus.codec import Decoder
from bus.errors import DecodeError, DropReason
from bus.eventlog import EventLogReader, EventLogWriter
from bus.schema import Envelope, Message


class NoteV1(Message, frozen=True):
    """How `test.note` looked in schema version 1 (for writing old events)."""

    KIND: ClassVar[str] = "test.note"
    KIND_BYTES: ClassVar[bytes] = b"test.note"
    SCHEMA_VERSION: ClassVar[int] = 1

    text: str
    priority: int


class Note(Message, frozen=True):
    """Version 2 dropped `priority`, and added `tags` in front of the new `urgent` flag."""

    KIND: ClassVar[str] = "test.note"
    KIND_BYTES: ClassVar[bytes] = b"test.note"
    SCHEMA_VERSION: ClassVar[int] = 2

    text: str
    tags: list[str]
    urgent: bool = False


def _lift_note_v1(envelope: list[Any], message: list[Any]) -> tuple[list[Any], list[Any]]:
    text, priority = message
    return envelope, [text, [], priority > 5]


@pytest.fixture
def note_upgrade(monkeypatch: pytest.MonkeyPatch) -> Iterator[Decoder]:
    monkeypatch.setitem(upgrade.UPGRADES, ("test.note", 1), _lift_note_v1)
    yield Decoder(catalogue={"test.note": Note})


def _frames(version: int, message: Message) -> list[bytes]:
    envelope = Envelope("test.note", version, "writer", 0, 1, 2, 3)
    return [b"test.note", msgspec.msgpack.encode([(envelope, message)])]


def test_old_event_is_upgraded_to_the_current_schema(note_upgrade: Decoder) -> None:
    event = note_upgrade.decode_one(_frames(1, NoteV1("disk full", 9)))
    assert event.message == Note("disk full", [], urgent=True)
    assert event.envelope.schema_version == 2


def test_old_events_in_a_log_are_upgraded_on_read(note_upgrade: Decoder, tmp_path: Any) -> None:
    writer = EventLogWriter(tmp_path)
    writer.append(_frames(1, NoteV1("a", 1)))
    writer.append(_frames(2, Note("b", ["x"])))
    writer.close()
    reader = EventLogReader(tmp_path, decoder=note_upgrade)
    assert [e.event.message for e in reader.events()] == [Note("a", [], False), Note("b", ["x"])]


def test_newer_version_is_refused(note_upgrade: Decoder) -> None:
    with pytest.raises(DecodeError) as newer:
        note_upgrade.decode_one(_frames(3, Note("from the future", [])))
    assert newer.value.reason is DropReason.UNSUPPORTED_VERSION


def test_old_version_without_upgrade_function_is_refused() -> None:
    with pytest.raises(DecodeError) as no_path:
        Decoder(catalogue={"test.note": Note}).decode_one(_frames(1, NoteV1("old", 1)))
    assert no_path.value.reason is DropReason.UNSUPPORTED_VERSION
    assert "no upgrade function" in no_path.value.detail


def test_appended_fields_are_compatible_both_ways() -> None:
    """A minor change: an old reader ignores a field appended at the end; a new reader defaults it."""

    class Old(Message, frozen=True):
        KIND: ClassVar[str] = "test.note"
        KIND_BYTES: ClassVar[bytes] = b"test.note"
        SCHEMA_VERSION: ClassVar[int] = 2
        text: str
        tags: list[str]

    old_reader = Decoder(catalogue={"test.note": Old})
    new_reader = Decoder(catalogue={"test.note": Note})
    assert old_reader.decode_one(_frames(2, Note("n", ["t"], urgent=True))).message == Old("n", ["t"])
    assert new_reader.decode_one(_frames(2, Old("o", []))).message == Note("o", [], urgent=False)


def test_duplicate_upgrade_registration_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(upgrade.UPGRADES, ("test.note", 1), _lift_note_v1)
    with pytest.raises(ValueError, match="already registered"):
        upgrade.register_upgrade("test.note", 1)(_lift_note_v1)
