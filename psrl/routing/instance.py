"""What the router knows about each rollout instance.

``InstanceSnapshot`` is the engine's periodic status report. ``InstanceView`` merges it with
what only the router knows: the version advertised after the last sync, the requests it routed
there and not yet released, and the tokens of requests routed after the snapshot was taken
(the engine echoes ``last_dispatch_seq``, the router's sequence number of the last request it
had admitted, so those are known exactly instead of guessed).
``CandidateState`` is the immutable copy of a view that one routing decision reads; it is also
what a decision record stores, so a replay sees exactly the inputs the policy saw.
"""

from __future__ import annotations

from collections import deque

import msgspec


class InstanceSnapshot(msgspec.Struct, frozen=True, gc=False):
    """One engine status report (sums, never per-request lists)."""

    instance_id: str
    seq: int  # per-instance report counter; older or repeated reports are ignored
    model_version: int  # weights loaded when the report was taken
    num_running: int
    num_waiting: int
    kv_tokens: int  # prompt + generated tokens of the running and waiting requests
    kv_capacity_tokens: int
    kv_usage: float  # fraction of KV blocks in use (prefix sharing makes it <= kv_tokens / capacity)
    budget_kv_tokens: int  # kv_tokens with each response rounded up by psrl.routing.budget
    response_tokens: int  # generated tokens of the running requests
    throughput: float  # decode tokens per second
    last_dispatch_seq: int  # router dispatch sequence number of the last request the engine admitted


class CandidateState(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """An instance as one routing decision sees it."""

    instance_id: str
    order: int  # position in the router's instance order (round robin, tie-breaks)
    version: int  # version after sync: new trajectories routed here get this V_traj
    num_inflight: int  # requests routed here and not yet released
    num_waiting: int
    kv_tokens: int  # snapshot tokens plus tokens of requests routed after the snapshot
    budget_kv_tokens: int
    kv_capacity_tokens: int
    is_paused: bool  # paused instances keep their pinned requests waiting but admit nothing
    # sessions whose last turn ran here and whose next turn will come back here (calling their tools);
    # load of new sessions under sticky routing, where in-flight requests alone miss them
    num_resting: int = 0

    @property
    def num_sessions(self) -> int:
        """Requests in flight plus sessions resting here: what a new sticky session shares the instance with."""
        return self.num_inflight + self.num_resting


class InstanceView:
    """Mutable router-side state of one instance; ``candidate()`` gives its current immutable copy."""

    __slots__ = (
        "_candidate",
        "_unseen",
        "instance_id",
        "is_healthy",
        "is_paused",
        "kv_capacity_tokens",
        "num_inflight",
        "num_resting",
        "order",
        "snapshot",
        "unseen_budget_tokens",
        "unseen_tokens",
        "version",
    )

    def __init__(self, instance_id: str, order: int, version: int, kv_capacity_tokens: int) -> None:
        self.instance_id = instance_id
        self.order = order
        self.version = version
        self.kv_capacity_tokens = kv_capacity_tokens
        self.is_healthy = True
        self.is_paused = False
        self.num_inflight = 0
        self.num_resting = 0
        self.snapshot: InstanceSnapshot | None = None
        self.unseen_tokens = 0
        self.unseen_budget_tokens = 0
        self._unseen: deque[tuple[int, int, int]] = deque()  # (dispatch_seq, tokens, budget tokens)
        self._candidate: CandidateState | None = None

    def candidate(self) -> CandidateState:
        if self._candidate is None:
            snap = self.snapshot
            self._candidate = CandidateState(
                self.instance_id,
                self.order,
                self.version,
                self.num_inflight,
                snap.num_waiting if snap else 0,
                (snap.kv_tokens if snap else 0) + self.unseen_tokens,
                (snap.budget_kv_tokens if snap else 0) + self.unseen_budget_tokens,
                self.kv_capacity_tokens,
                self.is_paused,
                self.num_resting,
            )
        return self._candidate

    def touch(self) -> None:
        """Forget the cached candidate after any change."""
        self._candidate = None

    def apply_snapshot(self, snapshot: InstanceSnapshot) -> bool:
        """Take a newer report; returns False (and changes nothing) for an old or repeated one."""
        if self.snapshot is not None and snapshot.seq <= self.snapshot.seq:
            return False
        self.snapshot = snapshot
        if snapshot.kv_capacity_tokens > 0:
            self.kv_capacity_tokens = snapshot.kv_capacity_tokens
        while self._unseen and self._unseen[0][0] <= snapshot.last_dispatch_seq:
            _, tokens, budget_tokens = self._unseen.popleft()
            self.unseen_tokens -= tokens
            self.unseen_budget_tokens -= budget_tokens
        self.touch()
        return True

    def on_routed(self, dispatch_seq: int, tokens: int, budget_tokens: int) -> None:
        self.num_inflight += 1
        self._unseen.append((dispatch_seq, tokens, budget_tokens))
        self.unseen_tokens += tokens
        self.unseen_budget_tokens += budget_tokens
        self.touch()

    def on_released(self) -> None:
        self.num_inflight = max(0, self.num_inflight - 1)
        self.touch()
