"""Cross-field validation: every rule the user's documents state, and the ones they imply.

Each rule is a function of the whole config that yields problems; `check(config)` runs them
all so every violation is reported at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from psrl.config.agents import agent_rules
from psrl.config.chunk_plan import chunk_plan
from psrl.config.psrl_section import LMCache
from psrl.config.root import Config
from psrl.config.rules_gpu_paths import GPU_PATH_RULES
from psrl.config.rules_lora import LORA_RULES
from psrl.config.rules_rl import RL_RULES
from psrl.engine_cost.model import CostModelError, load_cost_model
from psrl.errors import ConfigProblem

Rule = Callable[[Config], Iterator[ConfigProblem]]

P = "psrl."
RC = "psrl.rollout_coordination."
FGO = "psrl.fine_grain_overlap."


def problem(paths: tuple[str, ...] | str, value: object, message: str, fix: str) -> ConfigProblem:
    return ConfigProblem(paths if isinstance(paths, tuple) else (paths,), repr(value), message, fix)


def trainer_threads_non_negative(c: Config) -> Iterator[ConfigProblem]:
    threads = c.topology.trainer_threads
    if isinstance(threads, int) and threads < 0:
        yield problem("topology.trainer_threads", threads, "a thread count cannot be negative",
                      "use auto (the cores the other actors leave idle), 0 (threads_per_actor) or a count")  # fmt: skip


def cpu_placement_blockers(c: Config) -> list[tuple[str, str]]:
    """Settings under which the launcher cannot place the trainer's cores (launch.cpu_placement), each
    as (field, why); the host's own conditions (every actor local, no GPU) are checked before launch."""
    t = c.topology
    found = [
        ("topology.n_trainer_ranks", "it places one trainer rank", t.n_trainer_ranks != 1),
        ("topology.trainer_threads", "the trainer must size its threads to its cores", t.trainer_threads != "auto"),
        ("topology.threads_per_actor", "a pinned actor must compute on one thread", t.threads_per_actor != 1),
        ("topology.device", "it places CPU processes", t.device == "cuda"),
        ("topology.cluster", "the actors run on the cluster's nodes, not this host", t.cluster is not None),
        ("engine.backend", "vLLM's CPU engine binds its own threads to cores", c.engine.backend != "embedded"),
    ]  # fmt: skip
    return [(path, why) for path, why, blocks in found if blocks]


def cpu_placement_possible(c: Config) -> Iterator[ConfigProblem]:
    if c.topology.cpu_placement != "on":
        return
    for path, why in cpu_placement_blockers(c):
        yield problem(("topology.cpu_placement", path), "on", f"cannot place cores here: {why}",
                      f"set topology.cpu_placement=auto (where it can apply) or off, or change {path}")  # fmt: skip


def shared_prompts_need_packing(c: Config) -> Iterator[ConfigProblem]:
    if c.actor.share_prompts is True and not c.actor.packing:
        yield problem(("actor.share_prompts", "actor.packing"), True,
                      "a prompt is shared only inside a packed micro-batch (padded rows hold whole sequences)",
                      "set actor.packing=true or actor.share_prompts=auto")  # fmt: skip


def fused_old_log_probs_apply(c: Config) -> Iterator[ConfigProblem]:
    if c.actor.fuse_old_log_probs is not True:
        return
    for path, value, why in fusion_blockers(c):
        yield problem(("actor.fuse_old_log_probs", path), value, f"old log-probs cannot come from the update: {why}",
                      f"set actor.fuse_old_log_probs=auto or false, or change {path}")  # fmt: skip


def fusion_blockers(c: Config) -> Iterator[tuple[str, object, str]]:
    """Why a buffer's first mini-batch cannot take its old log-probs from its update (none: it can)."""
    if c.actor.ppo_epochs > 1:
        yield "actor.ppo_epochs", c.actor.ppo_epochs, "a later epoch needs them stored before the first"
    fgo = c.psrl.fine_grain_overlap
    if fgo.overlap_scope == "pre_step" and chunk_plan(c).effective != "none":
        yield FGO + "overlap_scope", "pre_step", "each chunk steps on its own forwards"
    if c.algorithm.rollout_correction.bypass_mode:
        yield "algorithm.rollout_correction.bypass_mode", True, "the engine's log-probs are the old ones"
    if c.actor.shuffle_samples:
        yield "actor.shuffle_samples", True, "the first mini-batch holds samples of every group, forwarded whole"


def staleness_non_negative(c: Config) -> Iterator[ConfigProblem]:
    if c.psrl.staleness < 0:
        yield problem(
            P + "staleness",
            c.psrl.staleness,
            "the staleness bound cannot be negative",
            "use 0 for synchronous training or 1..3 for asynchronous training",
        )


def shuffled_samples_need_whole_buffers(c: Config) -> Iterator[ConfigProblem]:
    if not c.actor.shuffle_samples:
        return
    fgo = c.psrl.fine_grain_overlap
    if c.actor.ppo_mini_batch_size >= c.psrl.staleness_buffer_entries:
        yield problem(
            ("actor.shuffle_samples", "actor.ppo_mini_batch_size", P + "staleness_buffer_entries"),
            True,
            "a buffer is one mini-batch, so there is nothing to deal (and the fused old log-probs would be lost)",
            "set actor.shuffle_samples=false, or actor.ppo_mini_batch_size below psrl.staleness_buffer_entries",
        )
    elif fgo.overlap_scope == "pre_step" and chunk_plan(c).effective != "none":
        yield problem(
            ("actor.shuffle_samples", FGO + "overlap_scope"),
            "true + pre_step",
            "under pre_step each chunk of groups is trained as one mini-batch as it arrives, so there is no "
            "buffer to deal samples from",
            f"set {FGO}overlap_scope=recompute (the steps then run on the whole buffer) or actor.shuffle_samples=false",
        )


def pre_step_needs_mini_batch(c: Config) -> Iterator[ConfigProblem]:
    fgo = c.psrl.fine_grain_overlap
    if fgo.granularity == "none" or fgo.overlap_scope != "pre_step":
        return
    plan = chunk_plan(c)
    if plan.effective != "mini_batch":
        yield problem(
            (FGO + "overlap_scope", FGO + "granularity", FGO + "multiplier"),
            f"pre_step with {fgo.granularity} x{fgo.multiplier} (effective: {plan.effective})",
            "pre_step steps the optimizer once per chunk, so a chunk must be exactly a mini-batch "
            "(a smaller chunk would need cross-chunk gradient accumulation)",
            f"use {FGO}overlap_scope=recompute, or {FGO}granularity=mini_batch, or raise "
            f"{FGO}multiplier until the micro-batch chunk clamps up to a mini-batch",
        )
    if c.actor.ppo_epochs != 1:
        yield problem(
            (FGO + "overlap_scope", "actor.ppo_epochs"),
            c.actor.ppo_epochs,
            "pre_step consumes each chunk once, so it cannot run several epochs",
            f"set actor.ppo_epochs=1 or {FGO}overlap_scope=recompute",
        )
    if fgo.granularity == "micro_batch" and c.actor.strategy == "megatron":
        yield problem(
            (FGO + "granularity", FGO + "overlap_scope", "actor.strategy"),
            "micro_batch + pre_step + megatron",
            "this combination is refused even after clamping",
            f"use actor.strategy=fsdp2 or {FGO}overlap_scope=recompute",
        )


def micro_batch_needs_static_sizes(c: Config) -> Iterator[ConfigProblem]:
    if c.psrl.fine_grain_overlap.granularity == "micro_batch" and c.actor.use_dynamic_bsz is True:
        yield problem(
            (FGO + "granularity", "actor.use_dynamic_bsz"),
            "micro_batch + use_dynamic_bsz=True",
            "micro-batch chunks are sized from the static ppo_micro_batch_size_per_gpu",
            f"set actor.use_dynamic_bsz=False or {FGO}granularity=mini_batch",
        )


def trainer_strategy_available(c: Config) -> Iterator[ConfigProblem]:
    if c.actor.strategy == "megatron":
        yield problem(
            "actor.strategy",
            "megatron",
            "psrl trains with torch data parallelism; Megatron is not available",
            "use actor.strategy=fsdp2 (or ddp)",
        )


def mini_batch_fits_buffer(c: Config) -> Iterator[ConfigProblem]:
    mini, buf = c.actor.ppo_mini_batch_size, c.psrl.staleness_buffer_entries
    if mini > buf or buf % mini:
        yield problem(
            ("actor.ppo_mini_batch_size", P + "staleness_buffer_entries"),
            f"{mini} vs {buf}",
            "a buffer (one training batch) must split into whole mini-batches",
            f"choose actor.ppo_mini_batch_size dividing {buf} (e.g. {_largest_divisor(buf, mini)})",
        )


def migration_prerequisites(c: Config) -> Iterator[ConfigProblem]:
    mig = c.psrl.rollout_coordination.sync_and_mig_strategy.mig
    if not mig.enable:
        return
    base = RC + "sync_and_mig_strategy.mig."
    if not c.psrl.status_collection.enable:
        yield problem(
            (base + "enable", P + "status_collection.enable"),
            False,
            "migration compares instance loads, which come from status snapshots",
            f"set {P}status_collection.enable=True",
        )
    if not c.psrl.rollout_coordination.partial_rollout.enable:
        yield problem(
            (base + "enable", RC + "partial_rollout.enable"),
            False,
            "migration aborts requests and continues them elsewhere, which is partial rollout",
            f"set {RC}partial_rollout.enable=True",
        )
    if mig.threshold is None:
        yield problem(
            base + "threshold",
            None,
            "migration needs an imbalance ratio",
            f"set {base}threshold (e.g. 5: busiest has 5x the load of the idlest)",
        )


def status_consumers_need_status(c: Config) -> Iterator[ConfigProblem]:
    rc = c.psrl.rollout_coordination
    if c.psrl.status_collection.enable:
        return
    users = []
    if rc.routing_strategy.method in ("request_num_balance", "throughput_optimal", "throughput_optimal_with_budget"):
        users.append(RC + "routing_strategy.method")
    if rc.sync_and_mig_strategy.method == "status_based":
        users.append(RC + "sync_and_mig_strategy.method")
    if rc.session_strategy.thunder_agent.enable:
        users.append(RC + "session_strategy.thunder_agent.enable")
    if users:
        yield problem(
            (*users, P + "status_collection.enable"),
            False,
            "these settings read instance status snapshots",
            f"set {P}status_collection.enable=True",
        )


def redundancy_sizes(c: Config) -> Iterator[ConfigProblem]:
    red = c.psrl.rollout_coordination.redundant_rollout
    base = RC + "redundant_rollout."
    if red.alg_global_batch_size != c.psrl.staleness_buffer_entries:
        yield problem(
            (base + "alg_global_batch_size", P + "staleness_buffer_entries"),
            f"{red.alg_global_batch_size} vs {c.psrl.staleness_buffer_entries}",
            "the algorithm's batch is one staleness buffer; the two must agree",
            f"leave {base}alg_global_batch_size unset or equal to {P}staleness_buffer_entries",
        )
    if red.alg_rollout_n != c.psrl.rollout_n:
        yield problem(
            (base + "alg_rollout_n", P + "rollout_n"),
            f"{red.alg_rollout_n} vs {c.psrl.rollout_n}",
            "the algorithm's group size is psrl.rollout_n; the two must agree",
            f"leave {base}alg_rollout_n unset or equal to {P}rollout_n",
        )
    for alg, red_name in (
        ("alg_global_batch_size", "redundant_global_batch_size"),
        ("alg_rollout_n", "redundant_rollout_n"),
    ):
        alg_v, red_v = getattr(red, alg), getattr(red, red_name)
        if red_v is not None and alg_v is not None and red_v < alg_v:
            yield problem(
                (base + red_name, base + alg),
                f"{red_v} < {alg_v}",
                "redundant sizes launch at least what the algorithm needs",
                f"set {base}{red_name} >= {alg_v}",
            )
        elif not red.enable and red_v != alg_v:
            yield problem(
                (base + red_name, base + "enable"),
                red_v,
                "a redundant size is set but redundant rollout is off",
                f"set {base}enable=True, or {base}{red_name}={alg_v}",
            )


def p2p_needs_versioned_kv(c: Config) -> Iterator[ConfigProblem]:
    lm = c.psrl.lmcache
    base = P + "lmcache."
    if lm.enable_p2p and (not lm.multi_version_kv or lm.clear_on_weight_update):
        yield problem(
            (base + "enable_p2p", base + "multi_version_kv", base + "clear_on_weight_update"),
            f"multi_version_kv={lm.multi_version_kv}, clear_on_weight_update={lm.clear_on_weight_update}",
            "the P2P backend has no clear operation and relies on version tags alone",
            f"set {base}multi_version_kv=True and {base}clear_on_weight_update=False",
        )
    if lm.enable_p2p and lm.store != "lmcache":
        yield problem(
            (base + "enable_p2p", base + "store"), lm.store,
            "peers write KV transfers into room the LMCache store lends; the host store cannot lend room",
            f"set {base}store=lmcache, or {base}enable_p2p=False",
        )  # fmt: skip
    if lm.enable_p2p and not lm.enable:
        yield problem(
            (base + "enable_p2p", base + "enable"), False, "P2P transfer moves offloaded KV", f"set {base}enable=True"
        )
    if lm.enable and lm.backend != "cpu":
        yield problem(base + "backend", lm.backend, f"the {lm.backend} tier is not available", "use backend=cpu")
    if lm.enable and c.engine.backend != "embedded":
        yield problem((base + "enable", "engine.backend"), c.engine.backend,
                      "the offload tier is wired to the embedded engine only (not to vLLM's LMCache connector)",
                      f"set engine.backend=embedded, or {base}enable=False")  # fmt: skip
    if lm.enable and not lm.save_decode_cache:
        yield problem(base + "save_decode_cache", False, "the tier keeps every evicted whole block, decode ones too",
                      f"set {base}save_decode_cache=True")  # fmt: skip
    if lm.enable and lm.chunk_size != LMCache.model_fields["chunk_size"].default:
        yield problem(base + "chunk_size", lm.chunk_size, "the tier stores whole KV blocks of engine.block_size",
                      f"leave {base}chunk_size unset and choose engine.block_size")  # fmt: skip


def kv_transfer_prerequisites(c: Config) -> Iterator[ConfigProblem]:
    kvt = c.psrl.rollout_coordination.routing_strategy.kv_transfer
    if not kvt.enable:
        return
    path = RC + "routing_strategy.kv_transfer.enable"
    if not (c.psrl.lmcache.enable and c.psrl.lmcache.enable_p2p):
        yield problem(
            (path, P + "lmcache.enable_p2p"),
            True,
            "KV transfer on re-routing uses the P2P KV path",
            f"set {P}lmcache.enable=True and {P}lmcache.enable_p2p=True",
        )
    if not c.psrl.rollout_coordination.partial_rollout.enable:
        yield problem(
            (path, RC + "partial_rollout.enable"),
            True,
            "only continued (partial) requests carry KV",
            f"set {RC}partial_rollout.enable=True",
        )


def sticky_sessions_need_bucketed(c: Config) -> Iterator[ConfigProblem]:
    rc = c.psrl.rollout_coordination
    ta = rc.session_strategy.thunder_agent
    if rc.routing_strategy.enable_trajectory_sticky and ta.enable and ta.continue_scope != "bucketed":
        scope = RC + "session_strategy.thunder_agent.continue_scope"
        yield problem(
            (RC + "routing_strategy.enable_trajectory_sticky", scope),
            ta.continue_scope,
            "a hung sticky session must be readmitted on the instance that holds its prefix",
            f"set {scope}=bucketed",
        )


# the hang/continue decision's own settings: read by nothing while the scheduler is off
THUNDER_DECISION_FIELDS = (
    "env_token_weight", "buffer_per_session", "continue_force_pin", "max_hang_s", "ready_first", "max_ready_wait_s",
)  # fmt: skip


def thunder_settings_need_thunder(c: Config) -> Iterator[ConfigProblem]:
    ta = c.psrl.rollout_coordination.session_strategy.thunder_agent
    defaults = type(ta)()
    changed = [name for name in THUNDER_DECISION_FIELDS if getattr(ta, name) != getattr(defaults, name)]
    if ta.env_token_weight == 1.0:  # the weight without a tier, which resolved configs (run dirs) carry
        changed = [name for name in changed if name != "env_token_weight"]
    if changed and not ta.enable:
        enable = RC + "session_strategy.thunder_agent.enable"
        yield problem(tuple(RC + "session_strategy.thunder_agent." + name for name in changed),
                      [getattr(ta, name) for name in changed], "ThunderAgent settings with the scheduler off",
                      f"set {enable}=True, or remove them")  # fmt: skip


def ready_wait_needs_ready_first(c: Config) -> Iterator[ConfigProblem]:
    ta = c.psrl.rollout_coordination.session_strategy.thunder_agent
    if ta.max_ready_wait_s > 0 and not ta.ready_first:
        wait = RC + "session_strategy.thunder_agent.max_ready_wait_s"
        first = RC + "session_strategy.thunder_agent.ready_first"
        yield problem((wait, first), ta.max_ready_wait_s,
                      "bounds the wait of ready turns, which only ready_first tells apart",
                      f"set {first}=True, or {wait}=0")  # fmt: skip


def sessions_need_an_environment(c: Config) -> Iterator[ConfigProblem]:
    """Hang/continue schedules sessions; sessions take their prompts from the environment (whose name
    the preflight checks: the environments sit above the config)."""
    thunder = RC + "session_strategy.thunder_agent.enable"
    if c.psrl.rollout_coordination.session_strategy.thunder_agent.enable and not c.env.enable:
        yield problem((thunder, "env.enable"), True, "hang/continue schedules multi-turn sessions, and there are none",
                      "set env.enable=True (with an environment task), or " + thunder + "=False")  # fmt: skip
    if c.env.enable and c.data.train_files:
        yield problem(("env.enable", "data.train_files"), c.data.train_files,
                      "sessions take their prompts from the environment task, not a dataset",
                      "remove data.train_files, or set env.enable=False")  # fmt: skip


def cost_model_readable(c: Config) -> Iterator[ConfigProblem]:
    rc = c.psrl.rollout_coordination
    needs = []
    if rc.routing_strategy.method.startswith("throughput_optimal"):
        needs.append(RC + "routing_strategy.method")
    sync = rc.sync_and_mig_strategy
    if sync.method == "status_based" and sync.sync.indicator == "hypothesis_test":
        needs.append(RC + "sync_and_mig_strategy.sync.indicator")
    if not needs:
        return
    path = rc.routing_strategy.cost_model_path
    field_path = RC + "routing_strategy.cost_model_path"
    if path is None:
        yield problem(
            (*needs, field_path),
            None,
            "this setting needs a fitted cost model",
            f"run `psrl calibrate` and set {field_path}=<file>, or use method=request_num_balance",
        )
        return
    try:
        load_cost_model(path)
    except CostModelError as exc:
        yield problem(field_path, path, str(exc), "point it at a file written by `psrl calibrate`")


def sync_threshold_set(c: Config) -> Iterator[ConfigProblem]:
    s = c.psrl.rollout_coordination.sync_and_mig_strategy
    if s.method == "status_based" and s.sync.indicator != "hypothesis_test" and s.sync.threshold is None:
        path = RC + "sync_and_mig_strategy.sync.threshold"
        yield problem(
            (RC + "sync_and_mig_strategy.method", path),
            None,
            f"status_based sync with indicator {s.sync.indicator} needs a threshold",
            f"set {path} (e.g. 2 for request_num)",
        )


def group_algorithms_need_groups(c: Config) -> Iterator[ConfigProblem]:
    if c.algorithm.adv_estimator == "grpo" and c.psrl.rollout_n < 2:
        yield problem(
            ("algorithm.adv_estimator", P + "rollout_n"),
            c.psrl.rollout_n,
            "GRPO normalises rewards within a prompt's group; a group of one has zero advantage",
            f"set {P}rollout_n to 2 or more (e.g. 8)",
        )
    if c.algorithm.filter_groups.enable and c.psrl.rollout_n < 2:
        yield problem(
            ("algorithm.filter_groups.enable", P + "rollout_n"),
            c.psrl.rollout_n,
            "a group of one always has zero reward variance, so every group would be dropped",
            f"set {P}rollout_n >= 2 or algorithm.filter_groups.enable=False",
        )


def partial_rollout_modes(c: Config) -> Iterator[ConfigProblem]:
    pr = c.psrl.rollout_coordination.partial_rollout
    if pr.interrupt_as_prompt and not pr.enable:
        yield problem(
            (RC + "partial_rollout.interrupt_as_prompt", RC + "partial_rollout.enable"),
            False,
            "interrupt_as_prompt is a mode of partial rollout",
            f"set {RC}partial_rollout.enable=True",
        )


def proactive_filter_threshold(c: Config) -> Iterator[ConfigProblem]:
    pf = c.psrl.rollout_coordination.proactive_filter_strategy
    path = RC + "proactive_filter_strategy.threshold"
    if pf.threshold < 0:
        yield problem(path, pf.threshold, "cannot be negative", "use 0 or more")
    elif pf.method is not None and pf.threshold >= c.psrl.staleness_buffer_entries:
        yield problem(
            (path, P + "staleness_buffer_entries"),
            pf.threshold,
            "the filter would act on buffers that have almost nothing yet",
            f"use a threshold below {c.psrl.staleness_buffer_entries} (a few groups)",
        )


def tms_rules(c: Config) -> Iterator[ConfigProblem]:
    tms, topo = c.psrl.tms, c.topology
    if tms.enable_cuda_graph and tms.range != "all":
        yield problem(
            (P + "tms.enable_cuda_graph", P + "tms.range"),
            tms.range,
            "releasing CUDA graphs needs every region managed",
            f"set {P}tms.range=all",
        )
    if tms.enable_nixl:
        yield problem(P + "tms.enable_nixl", True, "NIXL buffers of this version live in host memory, not in "
                      "GPU regions: nothing would read this switch", f"set {P}tms.enable_nixl=False")  # fmt: skip
    if tms.range is not None and not topo.colocate:
        yield problem(
            (P + "tms.range", "topology.colocate"),
            tms.range,
            "memory is released only when training and rollout take turns on shared GPUs",
            f"set topology.colocate=True, or {P}tms.range=null",
        )
    yield from _colocation_rules(c)


def _colocation_rules(c: Config) -> Iterator[ConfigProblem]:
    tms, topo = c.psrl.tms, c.topology
    if not topo.colocate:
        return
    if tms.range is None:
        yield problem(("topology.colocate", P + "tms.range"), None, "colocated training and rollout take turns "
                      "by releasing GPU memory", f"set {P}tms.range=all (or train)")  # fmt: skip
    elif tms.range == "rollout":
        yield problem(
            (P + "tms.range", "topology.colocate"),
            tms.range,
            "range=rollout leaves the trainer's weights, gradients and optimizer state resident on the shared "
            "GPUs, and this version has no optimizer offload",
            f"set {P}tms.range=all (or train)",
        )
    if topo.device == "cpu":
        yield problem(("topology.colocate", "topology.device"), "cpu", "colocation shares GPUs",
                      "set topology.device=cuda (or auto on a CUDA machine)")  # fmt: skip
    if c.engine.backend != "embedded":
        yield problem(("topology.colocate", "engine.backend"), c.engine.backend,
                      "colocated rollout releases the embedded engine's memory regions; the vLLM backend has none",
                      "set engine.backend=embedded")  # fmt: skip
    if c.psrl.fine_grain_overlap.granularity != "none":
        yield problem((FGO + "granularity", "topology.colocate"), c.psrl.fine_grain_overlap.granularity,
                      "the trainer would step on chunks while rollout still holds the GPUs",
                      f"set {FGO}granularity=none")  # fmt: skip
    if topo.trainer_gpus != topo.rollout_gpus:
        yield problem(("topology.trainer_gpus", "topology.rollout_gpus"), (topo.trainer_gpus, topo.rollout_gpus),
                      "colocated trainer ranks and rollout instances share the same GPUs",
                      "list the same GPUs in both (or leave both empty)")  # fmt: skip
    if c.trainer.background_push is True:
        yield problem(("trainer.background_push", "topology.colocate"), True,
                      "rollout needs the GPUs, and the new version, before the next step: a push in the background "
                      "would only hold its snapshot in their memory", "set trainer.background_push=auto")  # fmt: skip


def engine_backend(c: Config) -> Iterator[ConfigProblem]:
    """Settings the chosen backend cannot honour (whether vLLM is installed is checked by `psrl.preflight`)."""
    engine = c.engine
    if engine.backend != "vllm":
        if engine.vllm_args:
            yield problem("engine.vllm_args", engine.vllm_args, "only the vLLM backend reads it",
                          "set engine.backend=vllm, or remove engine.vllm_args")  # fmt: skip
        return
    if engine.cpu_kernels == "on":
        yield problem(("engine.cpu_kernels", "engine.backend"), "on", "the CPU kernels belong to the embedded engine",
                      "set engine.cpu_kernels=auto, or engine.backend=embedded")  # fmt: skip
    if c.psrl.ps.delta_sync and not c.actor.lora.enabled:  # LoRA versions: the backend writes whole adapters
        yield problem((P + "ps.delta_sync", "engine.backend"), True,
                      "the vLLM backend reloads whole layers, so every sync must carry every tensor",
                      f"set {P}ps.delta_sync=False, or engine.backend=embedded")  # fmt: skip


def gpu_placement(c: Config) -> Iterator[ConfigProblem]:
    topo = c.topology
    for name, gpus in (("trainer_gpus", topo.trainer_gpus), ("rollout_gpus", topo.rollout_gpus)):
        if any(g < 0 for g in gpus):
            yield problem("topology." + name, gpus, "GPU indices cannot be negative", "use indices 0, 1, ...")
        if gpus and topo.device == "cpu":
            yield problem(
                ("topology." + name, "topology.device"),
                gpus,
                "GPUs are placed but the device is cpu",
                f"set topology.device=cuda (or auto), or topology.{name}=[]",
            )
    trainer = topo.trainer_gpus
    if trainer and (len(trainer) < topo.n_trainer_ranks or len(set(trainer)) != len(trainer)):
        yield problem(
            ("topology.trainer_gpus", "topology.n_trainer_ranks"),
            trainer,
            f"each of the {topo.n_trainer_ranks} trainer ranks needs a GPU of its own (NCCL)",
            f"list {topo.n_trainer_ranks} distinct GPU indices, or leave topology.trainer_gpus empty",
        )


def cpu_kernels_apply(c: Config) -> Iterator[ConfigProblem]:
    """engine.cpu_kernels=on promises fused CPU decode; refuse a device or dtype the kernels do not run."""
    if c.engine.cpu_kernels != "on":
        return
    if c.topology.device == "cuda":
        yield problem(
            ("engine.cpu_kernels", "topology.device"), "on", "the CPU kernels do not run on cuda",
            "set engine.cpu_kernels=auto (or off), or topology.device=cpu",
        )  # fmt: skip
    if c.engine.dtype == "bfloat16":
        yield problem(
            ("engine.cpu_kernels", "engine.dtype"), "on", "the CPU decode kernels are float32 only",
            "set engine.dtype=float32 (or auto), or engine.cpu_kernels=auto",
        )  # fmt: skip


def gpu_kernels_apply(c: Config) -> Iterator[ConfigProblem]:
    """engine.gpu_kernels=on promises the Triton step kernels; refuse a device they do not run on."""
    if c.engine.gpu_kernels == "on" and c.topology.device == "cpu":
        yield problem(
            ("engine.gpu_kernels", "topology.device"), "on", "the GPU step kernels do not run on cpu",
            "set engine.gpu_kernels=auto (or off), or topology.device=cuda",
        )  # fmt: skip


RULES: tuple[Rule, ...] = (
    staleness_non_negative,
    shared_prompts_need_packing,
    fused_old_log_probs_apply,
    pre_step_needs_mini_batch,
    shuffled_samples_need_whole_buffers,
    micro_batch_needs_static_sizes,
    trainer_strategy_available,
    mini_batch_fits_buffer,
    migration_prerequisites,
    status_consumers_need_status,
    redundancy_sizes,
    p2p_needs_versioned_kv,
    kv_transfer_prerequisites,
    sticky_sessions_need_bucketed,
    thunder_settings_need_thunder,
    ready_wait_needs_ready_first,
    sessions_need_an_environment,
    cost_model_readable,
    sync_threshold_set,
    *RL_RULES,
    group_algorithms_need_groups,
    partial_rollout_modes,
    proactive_filter_threshold,
    tms_rules,
    engine_backend,
    gpu_placement,
    cpu_kernels_apply,
    gpu_kernels_apply,
)


def eval_settings_used(c: Config) -> Iterator[ConfigProblem]:
    defaults = type(c.eval)()
    changed = [name for name in type(c.eval).model_fields if getattr(c.eval, name) != getattr(defaults, name)]
    if c.trainer.eval_interval == 0 and changed:
        yield problem(tuple(f"eval.{name}" for name in changed), [getattr(c.eval, n) for n in changed],
                      "evaluation settings without evaluation (trainer.eval_interval=0)",
                      "set trainer.eval_interval (e.g. 10) or remove the eval.* settings")  # fmt: skip
    elif c.trainer.eval_interval and not c.eval.greedy and c.eval.k == 0:
        yield problem(("eval.greedy", "eval.k"), (False, 0), "an evaluation with no answers to score",
                      "set eval.greedy=True or eval.k >= 1")  # fmt: skip


def task_kwargs_used(c: Config) -> Iterator[ConfigProblem]:
    """task.kwargs configure a reasoning-gym dataset or a verifiers environment's loader; any other task
    would silently ignore them."""
    if c.task.kwargs and not c.task.name.startswith(("reasoning_gym:", "verifiers:")):
        yield problem(("task.kwargs", "task.name"), c.task.kwargs, f"task {c.task.name!r} takes no kwargs",
                      "remove task.kwargs or use task.name=reasoning_gym:<dataset> or verifiers:<env>")  # fmt: skip
    elif c.task.kwargs and c.data.train_files:
        yield problem(("task.kwargs", "data.train_files"), c.task.kwargs,
                      "the task's kwargs are unused: data.train_files replaces the task's prompts",
                      "remove task.kwargs or data.train_files")  # fmt: skip


RULES = (
    *RULES,
    trainer_threads_non_negative,
    cpu_placement_possible,
    eval_settings_used,
    agent_rules,
    task_kwargs_used,
    *LORA_RULES,
    *GPU_PATH_RULES,
)


def check(config: Config) -> list[ConfigProblem]:
    """Run every rule; return all problems found (empty when the config is valid)."""
    return [p for rule in RULES for p in rule(config)]


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)
