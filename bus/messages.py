"""Every message kind on the bus: one frozen struct per kind, grouped by area.

Adding a kind is one struct here plus its line in docs/protocol.md (``python -m bus.spec``
regenerates the catalogue section). Each docstring lists the fields, one ``name: meaning`` line
each; the spec generator reads them and a test checks that none is missing.

Arrays (token ids, logprobs, per-token versions) are numpy arrays: int32 for ids and versions,
float32 for logprobs. Small ones travel inside the message, large ones as zero-copy trailing
frames (see `bus.arrays`); a decoded array may be a read-only view on the received frame.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

import numpy as np
from msgspec import field

from bus.schema import Channel, Message, Part, message

# ---------------------------------------------------------------------------- enums


class ActorState(IntEnum):
    STARTING = 0
    READY = 1
    BUSY = 2
    IDLE = 3
    DRAINING = 4
    DEAD = 5


class FinishReason(IntEnum):
    """How a response ended: the one vocabulary of the engine, the router, the coordinator and the trainer."""

    STOP = 0  # end-of-sequence or a stop token
    LENGTH = 1  # max_tokens or the context length
    ABORT = 2  # stopped by an abort, with its partial output kept
    ERROR = 3  # the request failed
    TRUNCATED = 4  # force-completed by the proactive filter truncate: its partial output is its response (1.3)


# ---------------------------------------------------------------------------- actor lifecycle


@message("actor.hello")
class Hello(Message, frozen=True):
    """First event of an actor incarnation, before it serves anything.

    role: actor role (coordinator, router, rollout, trainer, ps, session, logger).
    host: host name the actor runs on.
    pid: operating-system process id.
    protocol_major: major protocol version the actor speaks.
    protocol_minor: minor protocol version the actor speaks.
    request_address: address of the actor's request (ROUTER) socket; empty if it serves no requests.
    """

    role: str
    host: str
    pid: int
    protocol_major: int
    protocol_minor: int
    request_address: str = ""


@message("actor.ready")
class Ready(Message, frozen=True):
    """The actor finished starting and serves requests.

    capacity: what the actor offers, by name (e.g. kv_blocks, max_num_seqs, shard_bytes).
    """

    capacity: dict[str, int] = field(default_factory=dict)


@message("actor.heartbeat")
class Heartbeat(Message, frozen=True):
    """Periodic liveness signal (every bus.heartbeat_interval_ms).

    state: current lifecycle state.
    num_inflight: requests or work items the actor holds right now.
    """

    state: ActorState
    num_inflight: int = 0


@message("actor.status")
class ActorStatus(Message, frozen=True):
    """The actor changed lifecycle state.

    state: new lifecycle state (starting, ready, busy, idle, draining, dead).
    detail: free text, e.g. what it is busy with.
    """

    state: ActorState
    detail: str = ""


@message("actor.dead")
class ActorDead(Message, frozen=True):
    """Last event of an actor that hit a fatal error, flushed before it exits.

    reason: one-line cause.
    traceback: formatted traceback, if any.
    """

    reason: str
    traceback: str = ""


# ---------------------------------------------------------------------------- supervisor


@message("sup.started")
class ActorStarted(Message, frozen=True):
    """The supervisor started an actor process.

    actor: actor name.
    incarnation: incarnation number of this start (0 for the first).
    pid: process id.
    host: host it runs on.
    warm: a warm spare (imports done ahead of need) became the actor, not a new process (added in 1.5).
    """

    actor: str
    incarnation: int
    pid: int
    host: str
    warm: bool = False


@message("sup.exited")
class ActorExited(Message, frozen=True):
    """An actor process exited.

    actor: actor name.
    incarnation: incarnation that exited.
    returncode: exit status; negative = killed by that signal.
    """

    actor: str
    incarnation: int
    returncode: int


@message("sup.stall")
class StallDiagnosed(Message, frozen=True):
    """The run made no training progress for ``run.stall_timeout_s`` while work was waiting: who holds
    it, what it waits for, and what the supervisor does about it (added in 1.9).

    holders: the actors that hold the work.
    waits_for: what they wait for, in a sentence.
    silent_s: seconds since the last training step.
    action: "restart" (the holders, once) or "end" (the run, with a resumable checkpoint).
    facts: what the diagnosis was made from (versions, queue, ledger), as name -> value text.
    """

    holders: list[str]
    waits_for: str
    silent_s: float
    action: str
    facts: dict[str, str] = field(default_factory=dict)


@message("sup.scale")
class ScaleDecided(Message, frozen=True):
    """A change of a role's instance set, with what it was decided from: the answer to a scale request
    (``ctl.scale``), or the supervisor's own when an instance is lost for good
    (``topology.restart_rollout=false``) (added in 1.10).

    token: the request's token; empty for a change the supervisor made on its own.
    role: the role scaled ("rollout").
    delta: instances asked to add (> 0) or remove (< 0); 0 when target was given.
    target: the number of instances asked for; -1: delta was given.
    before: the instances running before the change.
    limit: the most instances the placement has room for.
    next_index: the index a new instance would take.
    added: instances started.
    removed: instances that drain and stop (their requests continue elsewhere).
    error: why the request was refused (then nothing changed); empty: accepted.
    reason: who asked and why.
    """

    token: str
    role: str
    delta: int
    target: int
    before: list[str]
    limit: int
    next_index: int
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    error: str = ""
    reason: str = ""


@message("router.drained")
class InstanceDrained(Message, frozen=True):
    """A retiring instance holds no request any more: the supervisor may stop it (added in 1.10).

    instance: the instance's actor name.
    num_moved: requests handed back from it and routed elsewhere with their tokens.
    """

    instance: str
    num_moved: int = 0


@message("sup.restarted")
class ActorRestarted(Message, frozen=True):
    """The supervisor restarted an actor after it exited.

    actor: actor name.
    old_incarnation: incarnation that exited.
    new_incarnation: incarnation started in its place.
    num_restarts: restarts of this actor so far in the run.
    reason: why it was restarted.
    """

    actor: str
    old_incarnation: int
    new_incarnation: int
    num_restarts: int
    reason: str = ""


# ---------------------------------------------------------------------------- reliability (added in 1.4)


@message("actor.drops")
class ActorDrops(Message, frozen=True):
    """What an actor incarnation received and dropped so far, published when it changes (added in 1.4).

    counts: dropped messages by ``<input>:<reason>`` (malformed, unknown_kind, oversized,
        unsupported_version, unhandled, ...), totals since the incarnation started.
    """

    counts: dict[str, int]


# ---------------------------------------------------------------------------- control


@message("ctl.pause", channel=Channel.CONTROL)
class Pause(Message, frozen=True):
    """Stop starting new work; in-flight work is kept and resumes on Resume.

    targets: actor names addressed; empty = every actor.
    reason: why.
    """

    targets: list[str] = field(default_factory=list)
    reason: str = ""


@message("ctl.resume", channel=Channel.CONTROL)
class Resume(Message, frozen=True):
    """Undo a Pause.

    targets: actor names addressed; empty = every actor.
    """

    targets: list[str] = field(default_factory=list)


@message("ctl.drain", channel=Channel.CONTROL)
class Drain(Message, frozen=True):
    """Finish in-flight work, accept nothing new, then report state draining -> idle.

    targets: actor names addressed; empty = every actor.
    timeout_s: after this, remaining work is aborted (0 = wait forever).
    """

    targets: list[str] = field(default_factory=list)
    timeout_s: float = 0.0


@message("ctl.scale", channel=Channel.CONTROL)
class ScaleRequest(Message, frozen=True):
    """Ask the supervisor to change how many instances of a role run (`psrl scale`); it answers with
    ``sup.scale`` (added in 1.10).

    token: chosen by the asker; the answer echoes it.
    role: the role to scale ("rollout").
    delta: instances to add (> 0) or remove (< 0); used when target is -1.
    target: the number of instances wanted; -1: use delta.
    reason: who asks and why.
    """

    token: str
    role: str
    delta: int = 0
    target: int = -1
    reason: str = ""


@message("ctl.shutdown", channel=Channel.CONTROL)
class Shutdown(Message, frozen=True):
    """Exit cleanly (after flushing state and a final status event).

    targets: actor names addressed; empty = every actor.
    reason: why.
    """

    targets: list[str] = field(default_factory=list)
    reason: str = ""


# ---------------------------------------------------------------------------- generation


class RequestSampling(Part, frozen=True):
    """Sampling settings of one generation request (nested in GenerateRequest, not a kind).

    max_tokens: largest number of new tokens in total (including already-generated ones).
    temperature: softmax temperature (0 = greedy).
    top_p: nucleus mass.
    top_k: top-k cut (-1 = off).
    stop_token_ids: token ids that end the response.
    seed: per-request sampling seed; unset = engine's generator.
    min_tokens: no stop before this many tokens (added in 1.1).
    ignore_eos: the end-of-sequence token does not stop the response (added in 1.1).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False


@message("gen.request")
class GenerateRequest(Message, frozen=True):
    """Generate (or continue) one trajectory.

    request_id: trajectory id (prompt_id * responses_per_prompt + child index).
    prompt_id: prompt group id.
    prompt_token_ids: prompt tokens (int32).
    sampling: sampling settings.
    pinned_version: V_traj, the version the trajectory is pinned to (-1 = not yet pinned).
    generated_token_ids: tokens already generated, for a continuation (int32); unset = fresh.
    generated_logprobs: their logprobs (float32).
    generated_versions: the weight version that produced each of them (int32).
    instance_hint: preferred instance id; empty = no preference.
    is_sticky: keep the trajectory on the hinted instance.
    dispatch_seq: the router's dispatch number, echoed in the instance's status (added in 1.1).
    kv_source: the instance that held the trajectory's KV before this re-route; empty = none (added in 1.4).
    kv_source_address: that instance's KV server, where the target fetches the blocks (added in 1.4).
    """

    request_id: int
    prompt_id: int
    prompt_token_ids: np.ndarray
    sampling: RequestSampling
    pinned_version: int = -1
    generated_token_ids: np.ndarray | None = None
    generated_logprobs: np.ndarray | None = None
    generated_versions: np.ndarray | None = None
    instance_hint: str = ""
    is_sticky: bool = False
    dispatch_seq: int = -1
    kv_source: str = ""
    kv_source_address: str = ""


@message("gen.result")
class GenerateResult(Message, frozen=True):
    """A request finished (stopped, hit its length, was aborted or failed).

    request_id: trajectory id.
    prompt_id: prompt group id.
    token_ids: every generated token, continuation included (int32).
    logprobs: their logprobs (float32).
    versions: weight version of each token (int32).
    finish_reason: stop, length, abort or error.
    instance: instance id that generated the last token.
    error: error text when finish_reason is error.
    """

    request_id: int
    prompt_id: int
    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: FinishReason
    instance: str
    error: str = ""


@message("gen.abort", channel=Channel.CONTROL)
class Abort(Message, frozen=True):
    """Abort requests; each returns a GenerateResult with what it generated so far.

    request_ids: requests to abort.
    reason: why (staleness, migration, group complete, shutdown, ...).
    """

    request_ids: list[int]
    reason: str = ""


@message("inst.status")
class InstanceStatus(Message, frozen=True):
    """Snapshot of one rollout instance, published periodically.

    instance: instance id.
    weight_version: version of the loaded weights.
    num_running: requests being decoded.
    num_waiting: requests queued.
    kv_blocks_used: KV-cache blocks in use.
    kv_blocks_total: KV-cache blocks in all.
    tokens_per_s: decode throughput over the last interval.
    prefix_hit_rate: share of prompt tokens served from the prefix cache.
    num_tokens_running: tokens (prompt + generated) of the running requests, summed.
    is_paused: the instance is paused.
    kv_capacity_tokens: tokens the KV cache holds in all (added in 1.1).
    budget_kv_tokens: num_tokens_running with each response rounded up to the routing budget (added in 1.1).
    num_response_tokens: generated tokens of the running requests (added in 1.1).
    last_dispatch_seq: dispatch number of the last request admitted (added in 1.1).
    num_preempted_waiting: waiting requests that were preempted (added in 1.1).
    report_seq: this instance's report counter (added in 1.1).
    """

    instance: str
    weight_version: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_per_s: float = 0.0
    prefix_hit_rate: float = 0.0
    num_tokens_running: int = 0
    is_paused: bool = False
    kv_capacity_tokens: int = 0
    budget_kv_tokens: int = 0
    num_response_tokens: int = 0
    last_dispatch_seq: int = -1
    num_preempted_waiting: int = 0
    report_seq: int = 0


# ---------------------------------------------------------------------------- staleness ledger


@message("ledger.reserve")
class Reserve(Message, frozen=True):
    """A prompt group reserved a slot in the latest legal staleness buffer (worst case).

    prompt_id: prompt group id.
    version: trajectory version V_traj.
    buffer: buffer index b, V_traj <= b <= V_traj + eta.
    slot: entry index inside the buffer.
    """

    prompt_id: int
    version: int
    buffer: int
    slot: int


@message("ledger.occupy")
class Occupy(Message, frozen=True):
    """A completed prompt group moved from its reservation to the earliest legal buffer with room.

    prompt_id: prompt group id.
    version: group version (minimum over its trajectories).
    from_buffer: buffer it had reserved.
    buffer: buffer it now occupies.
    slot: entry index inside that buffer.
    """

    prompt_id: int
    version: int
    from_buffer: int
    buffer: int
    slot: int


@message("ledger.buffer_ready")
class BufferReady(Message, frozen=True):
    """A staleness buffer is full and may be consumed.

    buffer: buffer index.
    prompt_ids: the groups it holds, in slot order.
    """

    buffer: int
    prompt_ids: list[int]


@message("ledger.consume")
class Consume(Message, frozen=True):
    """The trainer took a ready buffer.

    buffer: buffer index.
    trainer_version: trainer's version when it consumed (trains version trainer_version + 1).
    """

    buffer: int
    trainer_version: int


@message("ledger.op")
class LedgerOp(Message, frozen=True):
    """One call on the staleness ledger and its outcome, for replaying the ledger (added in 1.1).

    op: finish, occupy, abort_child, abort_group or consume.
    prompt_id: prompt group id (buffer id for consume).
    child: child index (-1 when not applicable).
    reason: abort reason name (aborts only).
    outcome: the call's outcome, summarised as text.
    """

    op: str
    prompt_id: int
    child: int = -1
    reason: str = ""
    outcome: str = ""


@message("ledger.version_aborted")
class VersionAborted(Message, frozen=True):
    """Every buffer a version could still land in is full: its remaining work is aborted.

    version: the aborted trajectory version.
    num_requests: requests aborted.
    """

    version: int
    num_requests: int


# ---------------------------------------------------------------------------- weights


@message("wt.pushed")
class WeightsPushed(Message, frozen=True):
    """A trainer rank finished pushing its part of a version to the parameter server.

    version: version pushed.
    rank: trainer rank.
    num_bytes: bytes pushed by this rank.
    """

    version: int
    rank: int
    num_bytes: int


@message("wt.shard_stored")
class ShardStored(Message, frozen=True):
    """A parameter-server shard holds its complete part of a version.

    version: version stored.
    shard: shard index.
    num_tensors: tensors in the shard.
    num_bytes: bytes in the shard.
    digest: content digest of the shard.
    """

    version: int
    shard: int
    num_tensors: int
    num_bytes: int
    digest: str


@message("wt.published")
class WeightsPublished(Message, frozen=True):
    """Every shard holds the version: rollout instances may pull it.

    version: published version.
    manifest_digest: digest of the version's manifest (tensor names, shapes, shards, digests).
    num_shards: shards holding it.
    """

    version: int
    manifest_digest: str
    num_shards: int


@message("wt.pull")
class PullRequest(Message, frozen=True):
    """An instance starts pulling a version.

    instance: instance id.
    version: version pulled.
    """

    instance: str
    version: int


@message("wt.loaded")
class WeightsLoaded(Message, frozen=True):
    """An instance loaded a version in place.

    instance: instance id.
    version: loaded version.
    load_ms: pull plus load time in milliseconds (the instance's stop for the sync).
    prefetched: the version was pulled in the background before the sync (load_ms is then the wait
        for that pull to finish plus the load) (added in 1.2).
    pull_ms: the part of load_ms spent getting the bytes into host memory (the pull, or the wait for
        the background pull); the rest is the copy into the engine (added in 1.2).
    """

    instance: str
    version: int
    load_ms: float = 0.0
    prefetched: bool = False
    pull_ms: float = 0.0


@message("wt.sync_failed")
class InstanceSyncFailed(Message, frozen=True):
    """An instance could not pull or load a version; it keeps its old weights and takes no work.

    instance: instance id.
    version: version it tried to load.
    reason: why the pull or load failed.
    """

    instance: str
    version: int
    reason: str = ""


@message("wt.pull_retry")
class PullRetrying(Message, frozen=True):
    """A weight pull failed and is tried again; sent as it happens, even while the pull blocks the actor
    (added in 1.9).

    actor: the puller's actor (an instance, or a replacement trainer rank catching up).
    version: version being pulled (-1: the newest).
    attempt: the attempt that failed (1 = the first).
    max_attempts: attempts before the pull gives up.
    reason: why the attempt failed.
    """

    actor: str
    version: int
    attempt: int
    max_attempts: int
    reason: str = ""


# ---------------------------------------------------------------------------- coordination


@message("coord.sync", channel=Channel.CONTROL)
class SyncCommand(Message, frozen=True):
    """Instances must pull a newer version (the sync strategy decided so).

    instances: instance ids addressed.
    version: version to load.
    abort_running: interrupt running requests (partial rollout; an instance pulling the version in the
        background interrupts once the pull has landed), otherwise they finish first.
    strategy: the sync strategy that decided.
    """

    instances: list[str]
    version: int
    abort_running: bool = False
    strategy: str = ""


@message("coord.migrate", channel=Channel.CONTROL)
class MigrateCommand(Message, frozen=True):
    """Move requests from a busy instance to an idle one (partial-rollout continuation).

    source: instance the requests leave.
    target: instance they continue on.
    request_ids: requests moved; empty = chosen by the source (see num_requests).
    reason: the indicator values that triggered it.
    num_requests: with no request_ids, how many to move (0 = all of them) (added in 1.1).
    """

    source: str
    target: str
    request_ids: list[int]
    reason: str = ""
    num_requests: int = 0


@message("coord.tick")
class TickRecord(Message, frozen=True):
    """One sync/migration decision of the coordinator with its inputs, for `psrl replay --check` (added in 1.1).

    synced: instances told to sync.
    migrated: source instance of a migration; empty = none.
    record: inputs and decision (`psrl.coordination` structs, msgpack).
    """

    synced: list[str]
    migrated: str
    record: bytes


# ---------------------------------------------------------------------------- training


@message("train.batch")
class TrainBatch(Message, frozen=True):
    """Metadata of a ready buffer handed to the trainer (the data itself travels elsewhere).

    step: trainer step.
    buffer: staleness buffer index.
    prompt_ids: groups in the batch.
    num_trajectories: trajectories in the batch.
    num_tokens: tokens in the batch.
    min_version: oldest trajectory version in the batch.
    """

    step: int
    buffer: int
    prompt_ids: list[int]
    num_trajectories: int
    num_tokens: int
    min_version: int


@message("train.progress")
class TrainerProgress(Message, frozen=True):
    """The trainer finished a step and produced a version.

    step: finished step.
    version: version produced.
    num_samples: trajectories trained on in the step.
    step_s: wall time of the step in seconds.
    """

    step: int
    version: int
    num_samples: int
    step_s: float = 0.0


@message("obs.metrics")
class Metrics(Message, frozen=True):
    """Scalar metrics of one actor at one step.

    step: step the values belong to.
    values: metric name -> value.
    notes: text that goes with the values, e.g. the step's first failed reward call (added in 1.7).
    """

    step: int
    values: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------- router


@message("router.status")
class RouterStatus(Message, frozen=True):
    """The router's queue and what queued work each instance version could still take (added in 1.1).

    num_queued: requests waiting for an instance.
    num_inflight: requests running on instances.
    versions: instance versions the counts below are for.
    servable_without_new_entry: per version, queued continuations and siblings of reserved groups.
    servable_with_new_entry: per version, queued requests that would open a new staleness entry.
    next_buffer: the staleness buffer the trainer consumes next.
    num_loopbacks: partial-rollout continuations so far.
    num_wasted_tokens: tokens generated by work that was aborted and not continued.
    recovered: this incarnation rebuilt its staleness ledger from the log after its predecessor died, and
        continues it (added in 1.4); a router that starts from nothing starts a fresh ledger at next_buffer.
    """

    num_queued: int
    num_inflight: int
    versions: list[int]
    servable_without_new_entry: list[int]
    servable_with_new_entry: list[int]
    next_buffer: int = 0
    num_loopbacks: int = 0
    num_wasted_tokens: int = 0
    recovered: bool = False


@message("router.decision")
class RoutingRecord(Message, frozen=True):
    """One routing decision with the inputs it was made from, for `psrl replay --check` (added in 1.1).

    request_id: request placed.
    instance: instance chosen.
    policy: routing method.
    record: the decision (`psrl.routing.decision.RoutingDecision`, msgpack) including its inputs.
    """

    request_id: int
    instance: str
    policy: str
    record: bytes


# ---------------------------------------------------------------------------- groups (coordinator <-> router)


@message("group.finished")
class GroupFinished(Message, frozen=True):
    """Enough children of a prompt group finished: the router names the winners (router -> coordinator)
    (added in 1.12, with `group.accept`, in place of `group.complete`).

    prompt_id: prompt group id.
    request_ids: the responses kept (the first ones to finish).
    occupied_buffer: the group already occupies this buffer (proactive truncate), so the coordinator does
        not accept it again; -1 = not yet.
    """

    prompt_id: int
    request_ids: list[int]
    occupied_buffer: int = -1


@message("group.accept")
class GroupAccept(Message, frozen=True):
    """The coordinator keeps a finished group: occupy its staleness slot (coordinator -> router) (added in
    1.12, with `group.finished`, in place of `group.complete`; a filtered group gets `group.drop`).

    prompt_id: prompt group id.
    request_ids: the responses it keeps (the group's winners).
    """

    prompt_id: int
    request_ids: list[int]


@message("group.trajectory")
class TrajectoryDone(Message, frozen=True):
    """A trajectory of a prompt group ended (router -> coordinator) (added in 1.3).

    request_id: trajectory id.
    prompt_id: prompt group id.
    v_traj: the version the trajectory is pinned to (its first routing).
    token_ids: its whole response, every continuation included (int32).
    logprobs: their logprobs (float32).
    versions: weight version of each token (int32).
    finish_reason: stop, length or truncated (a response to train on), abort or error (given up).
    instance: instance id that generated the last token.
    error: why it was given up (abort reason or error text); empty otherwise.
    flags: how it was generated, TrajectoryFlags bits (interrupted, continued, migrated) (added in 1.4).
    loss_mask: per response token, 1 = generated (trained), 0 = environment tokens (uint8); unset = all
        generated (added in 1.4).
    env_reward: a session's reward from its environment; unset = score the response (added in 1.4).
    env_acc: a session's task accuracy from its environment (added in 1.4).
    num_turns: a session's generation turns; 0 = not a session (added in 1.4).
    prompt_keep: the trajectory's prompt is the first ``prompt_keep`` tokens of its group's prompt (a
        session that branched inside the prompt, ``TurnNext.prompt_keep``); -1 = the whole prompt (added in 1.14).
    """

    request_id: int
    prompt_id: int
    v_traj: int
    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: FinishReason
    instance: str
    error: str = ""
    flags: int = 0
    loss_mask: np.ndarray | None = None
    env_reward: float | None = None
    env_acc: float | None = None
    num_turns: int = 0
    prompt_keep: int = -1


@message("group.drop")
class GroupDrop(Message, frozen=True):
    """Give up a prompt group: abort its requests and free its slot (added in 1.1).

    prompt_id: prompt group id.
    reason: why (failed, filtered, shutdown).
    """

    prompt_id: int
    reason: str = ""


@message("group.refill")
class Refill(Message, frozen=True):
    """Groups were given up by the staleness machinery; launch this many fresh ones (added in 1.1).

    num_groups: fresh prompt groups to dispatch.
    reason: why (version aborted, proactive retry).
    prompt_ids: the groups given up.
    """

    num_groups: int
    reason: str = ""
    prompt_ids: list[int] = field(default_factory=list)


# ---------------------------------------------------------------------------- training data


@message("train.data", logged=False)
class TrainData(Message, frozen=True):
    """Trajectories of one buffer (or one chunk of it), sent to the trainer on its link (added in 1.1;
    not logged: ``train.batch`` and the trajectories' own events carry its facts).

    step: trainer step the data belongs to.
    buffer: staleness buffer index.
    chunk: chunk index within the buffer.
    num_chunks: chunks the buffer is released in.
    prompt_ids: prompt group of each trajectory.
    request_ids: request id of each trajectory.
    v_traj: pinned version of each trajectory.
    prompt_lengths: prompt tokens of each trajectory.
    response_lengths: response tokens of each trajectory.
    prompt_token_ids: every prompt, concatenated (int32).
    response_token_ids: every response, concatenated (int32).
    response_logprobs: engine log-probabilities of the responses, concatenated (float32).
    response_versions: weight version of each response token, concatenated (int32).
    rewards: reward of each trajectory (float32).
    accs: task accuracy of each trajectory (float32).
    finish_reasons: finish reason of each trajectory (int32, FinishReason values).
    flags: TrajectoryFlags bits of each trajectory (int32); unset = not recorded (added in 1.4).
    response_loss_mask: 1 = trained, 0 = environment token, concatenated like the responses (uint8); unset =
        every response token is trained (added in 1.4).
    """

    step: int
    buffer: int
    chunk: int
    num_chunks: int
    prompt_ids: np.ndarray
    request_ids: np.ndarray
    v_traj: np.ndarray
    prompt_lengths: np.ndarray
    response_lengths: np.ndarray
    prompt_token_ids: np.ndarray
    response_token_ids: np.ndarray
    response_logprobs: np.ndarray
    response_versions: np.ndarray
    rewards: np.ndarray
    accs: np.ndarray
    finish_reasons: np.ndarray
    flags: np.ndarray | None = None
    response_loss_mask: np.ndarray | None = None


# -------------------------------------------------------------------- evaluation and staleness certificates (1.4)


class TrajectoryFlags(IntFlag):
    """How a trajectory came to be, as the router saw it (``TrajectoryDone.flags``, ``TrainData.flags``)."""

    INTERRUPTED = 1  # an instance handed it back unfinished at least once (sync, migrate, preempted, ...)
    CONTINUED = 2  # a later request continued it from its tokens (partial rollout)
    MIGRATED = 4  # more than one instance returned results for it


@message("eval.request")
class EvalRequest(Message, frozen=True):
    """Held-out prompts for one instance to answer at the weights it holds (coordinator -> instance, on the
    bus; never routed, never in a staleness buffer) (added in 1.4).

    instance: the instance that evaluates.
    round: evaluation round (one per evaluated version).
    version: the version the coordinator asks for (the results carry the version actually used).
    sample_ids: id of each sample within the round.
    prompt_lengths: prompt tokens of each sample (int32).
    prompt_token_ids: every prompt, concatenated (int32).
    sampling: sampling settings of each sample (greedy or sampled).
    """

    instance: str
    round: int
    version: int
    sample_ids: list[int]
    prompt_lengths: np.ndarray
    prompt_token_ids: np.ndarray
    sampling: list[RequestSampling]


@message("eval.result")
class EvalResult(Message, frozen=True):
    """One evaluation sample finished (instance -> coordinator, on the bus) (added in 1.4).

    instance: the instance that generated it.
    round: evaluation round.
    sample_id: id of the sample within the round.
    token_ids: the response (int32).
    version: the weight version every token of it was generated with (-1 = none generated).
    finish_reason: stop, length, abort or error.
    error: why it failed or was aborted; empty otherwise.
    """

    instance: str
    round: int
    sample_id: int
    token_ids: np.ndarray
    version: int
    finish_reason: FinishReason
    error: str = ""


@message("train.certificate")
class StalenessCertificate(Message, frozen=True):
    """What one trained buffer was made of, logged by the trainer once per step (``psrl replay --check
    staleness`` re-derives it from the generation events) (added in 1.4).

    buffer: staleness buffer index consumed.
    version: version the step produced (buffer + 1).
    request_ids: trajectory ids (int32).
    v_traj: pinned version of each trajectory (int32).
    min_token_version: oldest weight version among each trajectory's tokens (int32; -1 = no tokens).
    max_token_version: newest weight version among each trajectory's tokens (int32; -1 = no tokens).
    flags: TrajectoryFlags bits of each trajectory (int32; -1 = not recorded).
    is_mean: mean truncated importance weight over each trajectory's tokens (float32; nan = not measured).
    is_clipped_frac: fraction of each trajectory's tokens whose weight hit the threshold (float32; nan = not measured).
    is_threshold: the truncation threshold (0 = no importance sampling).
    correction: the rollout correction applied, e.g. ``is=token[-,2];rs=token[0.5,5]``; ``none`` = none; empty =
        not recorded (added in 1.8).
    masked_frac: fraction of each trajectory's trained tokens the correction rejected (float32; nan = no
        rejection configured); unset = not recorded (added in 1.8).
    """

    buffer: int
    version: int
    request_ids: np.ndarray
    v_traj: np.ndarray
    min_token_version: np.ndarray
    max_token_version: np.ndarray
    flags: np.ndarray
    is_mean: np.ndarray
    is_clipped_frac: np.ndarray
    is_threshold: float = 0.0
    correction: str = ""
    masked_frac: np.ndarray | None = None


# ---------------------------------------------------------------------------- KV offload tier and transfer (1.4)


@message("kv.tier")
class KvTierReport(Message, frozen=True):
    """What an instance's offload tier gained and lost since its previous report (incremental).

    instance: instance id.
    address: the instance's KV server (peers fetch blocks there); empty = no KV transfer.
    added: (weight version, chained block hash) of each block stored, as rows of an int64 [n, 2] array.
    removed: the same for each block evicted.
    cleared: everything reported before is gone (clear_on_weight_update, or a periodic snapshot whose
        ``added`` lists every block held), then ``added``.
    report_seq: the instance's report number; on a gap (reports lost) the router forgets the instance's
        blocks until its next snapshot rather than score blocks that may be gone.
    """

    instance: str
    address: str
    added: np.ndarray
    removed: np.ndarray
    cleared: bool = False
    report_seq: int = 0


@message("kv.transfer")
class KvTransferRecord(Message, frozen=True):
    """One KV transfer as the target saw it (for the log and the benchmark).

    request_id: trajectory id.
    source: the instance the blocks came from.
    target: the instance that fetched them.
    mode: async / sync / pin_sync.
    num_blocks: blocks that landed in the target's tier.
    num_bytes: their bytes.
    seconds: from the fetch's start to its end.
    error: why nothing landed (timeout, dead source, ...); empty = the source answered.
    """

    request_id: int
    source: str
    target: str
    mode: str
    num_blocks: int
    num_bytes: int
    seconds: float
    error: str = ""


# ---------------------------------------------------------------------------- batched token streams (1.4)


@message("gen.tokens", logged=False)
class TokenBatch(Message, frozen=True):
    """Tokens an instance streams for many requests at once, one message per engine step (added in 1.4;
    not logged: each request's result carries every token).

    request_ids: trajectory id of each run of tokens (int64).
    counts: number of tokens of each request, in the order of request_ids (int32).
    token_ids: the runs of new tokens, concatenated in that order (int32).
    logprobs: their logprobs (float32).
    versions: weight version that produced each token (int32).
    instance: instance id that generated them.
    """

    request_ids: np.ndarray
    counts: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    instance: str


# ---------------------------------------------------------------------------- GPU memory (torch-memory-saver)


@message("tms.pause", channel=Channel.CONTROL)
class MemoryPause(Message, frozen=True):
    """Release the GPU memory of the addressed actors' managed regions (colocated training and rollout)
    (added in 1.4). Paused memory keeps its virtual addresses; nothing runs on the GPU until MemoryResume.

    targets: actor names addressed.
    reason: why (which phase of the consume/generate cycle begins).
    """

    targets: list[str]
    reason: str = ""


@message("tms.resume", channel=Channel.CONTROL)
class MemoryResume(Message, frozen=True):
    """Re-acquire the memory a MemoryPause released, at the same addresses (added in 1.4).

    targets: actor names addressed.
    reason: why.
    """

    targets: list[str]
    reason: str = ""


@message("tms.switched")
class MemorySwitched(Message, frozen=True):
    """An actor paused or resumed its managed GPU memory (added in 1.4).

    actor: the actor that switched.
    side: trainer or rollout.
    action: pause or resume.
    regions: the regions switched (psrl.tms.regions names).
    duration_ms: how long the switch took in the actor, device synchronised.
    changed_bytes: device memory released (pause) or re-acquired (resume), from cudaMemGetInfo.
    free_bytes: device memory free after the switch.
    region_ms: per region, how long its own pause or resume took.
    """

    actor: str
    side: str
    action: str
    regions: list[str]
    duration_ms: float
    changed_bytes: int
    free_bytes: int
    region_ms: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------- sessions (multi-turn agentic RL, 1.4)
# A session is one trajectory of many turns: the router generates each turn on the session's pinned
# instance and hands the turn to the session scheduler, which runs the environment step and sends
# the next turn (or the end). Every kind below was added in 1.4.


@message("session.turn_started")
class TurnStarted(Message, frozen=True):
    """A session's turn was placed on an instance (router -> session scheduler): the session is pinned there.

    request_id: trajectory id (the session).
    prompt_id: prompt group id.
    instance: instance the turn runs on.
    turn: turn index (0 = the first generation).
    num_tokens: tokens of the session so far (its KV footprint on the instance).
    """

    request_id: int
    prompt_id: int
    instance: str
    turn: int
    num_tokens: int


@message("session.turn_done")
class TurnDone(Message, frozen=True):
    """A session's turn finished generating (router -> session scheduler).

    request_id: trajectory id (the session).
    prompt_id: prompt group id.
    instance: instance that generated it.
    turn: turn index.
    token_ids: the tokens generated in this turn, exactly as the engine produced them (int32).
    num_tokens: tokens of the session so far, this turn included.
    finish_reason: stop or length.
    logprobs: the engine's log-probs of token_ids (float32; what the gateway answers a call asking for logprobs).
    """

    request_id: int
    prompt_id: int
    instance: str
    turn: int
    token_ids: np.ndarray
    num_tokens: int
    finish_reason: FinishReason
    logprobs: np.ndarray | None = None


@message("session.turn_next")
class TurnNext(Message, frozen=True):
    """The environment answered: generate the session's next turn (session scheduler -> router).

    request_id: trajectory id (the session).
    turn: index of the turn to generate.
    observation_token_ids: the environment's reply, appended to the session as is (int32; never trained).
    max_tokens: the new turn's generation budget.
    force_pin_instance: place this turn on this instance once (a continued session); empty = routing decides.
    cut_to: a branch (the agent edited its history): the session's response is cut back to its first
        ``cut_to`` tokens before the observation is appended (their tokens, log-probs, versions and loss
        mask; the pinned version and the ledger reservation stay); -1 = no cut (added in 1.13).
    num_cut: tokens the cut drops (the abandoned branch's tail; 0 without a cut) (added in 1.13; the prompt's
        dropped tokens count too since 1.14).
    prompt_keep: a branch inside the prompt (the agent edited the row's messages or dropped the first
        reply): the session's prompt is cut to its first ``prompt_keep`` tokens (0 < it < the prompt's
        length) and its whole response is dropped (``cut_to`` is 0); -1 = the prompt stays (added in 1.14).
    """

    request_id: int
    turn: int
    observation_token_ids: np.ndarray
    max_tokens: int
    force_pin_instance: str = ""
    cut_to: int = -1
    num_cut: int = 0
    prompt_keep: int = -1


@message("session.end")
class SessionEnd(Message, frozen=True):
    """A session is over (session scheduler -> router): its trajectory finishes with the reward, or fails.

    request_id: trajectory id (the session).
    reward: the environment's reward.
    acc: the environment's task accuracy.
    num_turns: generation turns the session took.
    error: why the session failed (environment error, timeout, malformed reply); empty = it finished.
    """

    request_id: int
    reward: float
    acc: float
    num_turns: int
    error: str = ""


@message("session.gone")
class SessionGone(Message, frozen=True):
    """The router ended a session's trajectory on its own (surplus, staleness, failure): forget it.

    request_id: trajectory id (the session).
    reason: why.
    """

    request_id: int
    reason: str = ""


@message("session.env_step")
class EnvStepDone(Message, frozen=True):
    """An environment step of a session finished in an env worker (session scheduler's own record).

    request_id: trajectory id (the session).
    turn: the turn whose action the environment answered.
    observation_token_ids: the environment's reply as tokens (int32).
    reward: reward so far (final when done).
    acc: task accuracy (final when done).
    done: the episode is over.
    error: why the step failed (raised, timed out, malformed, worker lost twice); empty = it worked.
    worker: env worker that ran it.
    latency_ms: wall time of the step.
    """

    request_id: int
    turn: int
    observation_token_ids: np.ndarray
    reward: float = 0.0
    acc: float = 0.0
    done: bool = False
    error: str = ""
    worker: int = -1
    latency_ms: float = 0.0


@message("session.env_worker")
class EnvWorkerReady(Message, frozen=True):
    """An env worker process of the session scheduler reported ready (added in 1.6).

    worker: the worker's index in the pool.
    pid: its process id.
    replaced_pid: the process it replaces (died, killed or timed out); 0 = one of the pool's first workers.
    reason: why the one it replaces was replaced; empty for a first worker.
    startup_ms: wall time from starting the process to its ready.
    """

    worker: int
    pid: int
    replaced_pid: int = 0
    reason: str = ""
    startup_ms: float = 0.0


@message("session.tick")
class SessionTick(Message, frozen=True):
    """One ThunderAgent hang/continue decision with its inputs, for `psrl replay --check sessions`.

    hung: sessions hung by this tick.
    continued: sessions continued by this tick.
    record: inputs and decision (`psrl.coordination.session` structs, msgpack).
    """

    hung: list[int]
    continued: list[int]
    record: bytes


# ---------------------------------------------------------------------------- run


@message("run.finished", channel=Channel.CONTROL)
class RunFinished(Message, frozen=True):
    """The coordinator ends the run: the launcher then shuts every actor down in order.

    success: the run reached its goal (all training steps done).
    reason: one-line summary of why it ended.
    summary: final figures (e.g. first and last reward, steps, trajectories per second).
    """

    success: bool
    reason: str = ""
    summary: dict[str, float] = field(default_factory=dict)
