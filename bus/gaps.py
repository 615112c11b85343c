"""Detect lost events from per-sender sequence numbers.

Every sender numbers its events 1, 2, 3, ... per incarnation, so a receiver that sees every kind
can tell how many events it missed (dropped at a high-water mark, or lost in a crash) without any
help from the sockets. Events of one sender may arrive slightly out of order when they travel on
two channels (events and control); a late event that fills a hole takes its loss back.
"""

from __future__ import annotations

from dataclasses import dataclass

from bus.schema import Envelope


@dataclass
class SenderSeq:
    next_seq: int
    num_missing: int = 0
    num_late: int = 0


class GapTracker:
    """Counts missing and late events per sender incarnation.

    `from_first_seen` starts each sender's count at the first event seen (a subscriber that joined
    late); otherwise every sender is expected to start at seq 1 (the event log).
    """

    def __init__(self, from_first_seen: bool = True) -> None:
        self.from_first_seen = from_first_seen
        self.senders: dict[tuple[str, int], SenderSeq] = {}

    @property
    def num_missing(self) -> int:
        return sum(s.num_missing for s in self.senders.values())

    def observe(self, envelope: Envelope) -> int:
        """Account for one event; returns how many events this one revealed as missing."""
        key = (envelope.sender, envelope.incarnation)
        state = self.senders.get(key)
        seq = envelope.seq
        if state is None:
            start = seq if self.from_first_seen else 1
            state = self.senders[key] = SenderSeq(next_seq=start)
        if seq >= state.next_seq:
            missing = seq - state.next_seq
            state.num_missing += missing
            state.next_seq = seq + 1
            return missing
        if state.num_missing > 0:
            state.num_missing -= 1
            state.num_late += 1
        return 0
