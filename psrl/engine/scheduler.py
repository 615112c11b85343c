"""Continuous batching: which sequences run in the next step, and how many tokens of each.

A step is either a prefill step (new or resumed sequences, chunked to the token budget) or a
decode step (one token for every running sequence). Prefill goes first so new work joins the
batch quickly. When the KV cache cannot hold the next decode token of every running sequence,
the most recently admitted ones are preempted: their blocks are freed and they go back to the
front of the waiting queue with all their tokens, to be recomputed later (their prefix blocks
often still hit the prefix cache). No request is ever dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from psrl.engine.block_manager import BlockManager
from psrl.engine.sequence import Sequence, SequenceStatus

# prefill chunk, in blocks, of a sequence whose KV is still landing: short enough that a transfer
# that lands during the first chunk saves the rest of the prefill
ARRIVING_CHUNK_BLOCKS = 8


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens each sequence computes this step
    is_prefill: bool
    num_steps: int = 1  # decode steps of this round (blocks are allocated for all of them)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
    ) -> None:
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self, decode_steps: int = 1) -> ScheduledBatch | None:
        """The next step's batch, or None when there is nothing that can run.

        `decode_steps` > 1 asks for a decode round of that many steps: granted when the free blocks cover
        every running sequence's round (up to its length limit), else the round is one step.
        """
        prefill = self._schedule_prefill()
        if prefill is not None:
            return prefill
        return (self._schedule_round(decode_steps) if decode_steps > 1 else None) or self._schedule_decode()

    def remove(self, seq: Sequence) -> None:
        """Take `seq` out of the queues and free its blocks (finish or abort)."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED

    def _schedule_prefill(self) -> ScheduledBatch | None:
        batch = ScheduledBatch(seqs=[], num_new_tokens=[], is_prefill=True)
        budget = self.max_num_batched_tokens
        # running sequences whose chunked prefill is unfinished come first
        for seq in self.running:
            if seq.is_prefilling and budget > 0:
                budget -= self._add_chunk(batch, seq, budget)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= self._add_chunk(batch, seq, budget)
        return batch if batch.seqs else None

    def _add_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        if seq.kv_arriving:
            self.block_manager.extend_from_tier(seq)
            budget = min(budget, ARRIVING_CHUNK_BLOCKS * self.block_manager.block_size)
        num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(num_new)
        return num_new

    def _schedule_decode(self) -> ScheduledBatch | None:
        scheduled: list[Sequence] = []
        candidates = deque(self.running)
        blocks = self.block_manager
        while candidates:
            seq = candidates.popleft()
            missing = blocks.num_missing_blocks(seq)
            if missing == 0:  # the common step: the newest token still fits in the last block
                scheduled.append(seq)
                continue
            while missing > blocks.num_free_blocks:
                victim = candidates.pop() if candidates else seq
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                blocks.may_append(seq, missing)
                scheduled.append(seq)
        if not scheduled:
            return None
        return ScheduledBatch(seqs=scheduled, num_new_tokens=[1] * len(scheduled), is_prefill=False)

    def _schedule_round(self, num_steps: int) -> ScheduledBatch | None:
        blocks, running = self.block_manager, self.running
        block_size, max_len = blocks.block_size, self.max_model_len
        needed = []
        for seq in running:  # per sequence per round: kept to plain arithmetic
            num_tokens = len(seq.token_ids)
            left = min(seq.params.max_tokens - num_tokens + seq.num_prompt_tokens, max_len - num_tokens)
            covered = num_tokens - 1 + min(num_steps, left)
            needed.append(max(0, (covered + block_size - 1) // block_size - len(seq.block_table)))
        if not running or sum(needed) > blocks.num_free_blocks:
            return None
        for seq, missing in zip(running, needed, strict=True):
            if missing:
                blocks.may_append(seq, missing)
        return ScheduledBatch(list(running), [1] * len(running), is_prefill=False, num_steps=num_steps)

    def preempt_all(self) -> int:
        """Free every running sequence's blocks; they wait (first admitted first) and are prefilled again."""
        running = list(self.running)
        for seq in reversed(running):
            self._preempt(seq)
        return len(running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
