"""Releasing a staleness buffer to the trainer in chunks (fine-grain overlap), in occupancy order.

Buffers are trained strictly in order. Only the buffer the trainer needs next (``current``)
releases chunks: each time ``chunk_groups`` more of its groups are occupied a chunk goes out,
and the rest goes when it is ready. The ledger keeps that buffer's occupancy order append-only,
so a chunk once emitted never changes. Groups occupied in later buffers wait until those
buffers become current. With granularity ``none`` the single chunk is the whole buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    buffer: int
    index: int
    num_chunks: int
    prompt_ids: tuple[int, ...]

    @property
    def is_last(self) -> bool:
        return self.index == self.num_chunks - 1


@dataclass
class _ChunkedBuffer:
    occupied: list[int] = field(default_factory=list)
    num_emitted_groups: int = 0
    num_emitted_chunks: int = 0
    is_ready: bool = False


class ChunkEmitter:
    def __init__(self, chunk_groups: int, buffer_groups: int, first_buffer: int = 0) -> None:
        if not 1 <= chunk_groups <= buffer_groups:
            raise ValueError(f"chunk of {chunk_groups} groups for buffers of {buffer_groups}")
        self.chunk_groups = chunk_groups
        self.buffer_groups = buffer_groups
        self.num_chunks = -(-buffer_groups // chunk_groups)
        self.current = first_buffer
        self._buffers: dict[int, _ChunkedBuffer] = {}

    def on_occupied(self, buffer: int, prompt_id: int) -> list[Chunk]:
        state = self._buffers.setdefault(buffer, _ChunkedBuffer())
        if prompt_id not in state.occupied:
            state.occupied.append(prompt_id)
        return self._emit() if buffer == self.current else []

    def on_moved(self, prompt_id: int, from_buffer: int, to_buffer: int) -> list[Chunk]:
        """An occupied group moved between buffers (proactive filter); only into the current one."""
        source = self._buffers.get(from_buffer)
        if source is not None and prompt_id in source.occupied:
            source.occupied.remove(prompt_id)
        return self.on_occupied(to_buffer, prompt_id)

    def on_ready(self, buffer: int, prompt_ids: list[int]) -> list[Chunk]:
        state = self._buffers.setdefault(buffer, _ChunkedBuffer())
        state.occupied = list(prompt_ids)  # the router's authoritative order
        state.is_ready = True
        return self._emit() if buffer == self.current else []

    def advance(self) -> list[Chunk]:
        """The current buffer was fully handed over; the next one becomes current."""
        self._buffers.pop(self.current, None)
        self.current += 1
        return self._emit()

    def is_current_done(self) -> bool:
        state = self._buffers.get(self.current)
        return state is not None and state.is_ready and state.num_emitted_chunks == self.num_chunks

    def _emit(self) -> list[Chunk]:
        state = self._buffers.get(self.current)
        if state is None:
            return []
        chunks = []
        while state.num_emitted_chunks < self.num_chunks:
            start = state.num_emitted_groups
            is_last = state.num_emitted_chunks == self.num_chunks - 1
            end = len(state.occupied) if is_last else start + self.chunk_groups
            if len(state.occupied) < end or (is_last and not state.is_ready):
                break
            chunks.append(
                Chunk(self.current, state.num_emitted_chunks, self.num_chunks, tuple(state.occupied[start:end]))
            )
            state.num_emitted_groups = end
            state.num_emitted_chunks += 1
        return chunks


# ---------------------------------------------------------------------------- how big a chunk is
#
# A chunk is the unit of completed prompt groups released to the trainer before the whole
# staleness buffer is ready.
#
# * ``mini_batch``: ``ppo_mini_batch_size * multiplier`` groups.
# * ``micro_batch``: ``ppo_micro_batch_size_per_gpu * dp_size * multiplier`` samples, rounded up
#   to whole groups (only whole groups ever complete).
#
# Clamp rule: a micro-batch chunk larger than one mini-batch becomes a mini-batch chunk; a
# mini-batch chunk larger than the whole buffer becomes ``none`` (wait for the buffer).
