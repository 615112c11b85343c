import json

import pytest

from psrl.config import load_config
from psrl.engine_cost.model import CostModel
from psrl.errors import ConfigError

RC = "psrl.rollout_coordination."
FGO = "psrl.fine_grain_overlap."


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return str(info.value)


def test_negative_staleness() -> None:
    assert "psrl.staleness = -1" in refused("psrl.staleness=-1")


def test_throughput_optimal_needs_cost_model() -> None:
    assert "routing_strategy.cost_model_path" in refused(RC + "routing_strategy.method=throughput_optimal")


def test_throughput_optimal_needs_readable_cost_model(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    msg = refused(RC + "routing_strategy.method=throughput_optimal", f"{RC}routing_strategy.cost_model_path={bad}")
    assert "not readable JSON" in msg
    good = tmp_path / "good.json"
    CostModel(1e-8, 0.004, 1e-4, 0.002).save(good)
    load_config(
        None, [RC + "routing_strategy.method=throughput_optimal", f"{RC}routing_strategy.cost_model_path={good}"]
    )


def test_pre_step_with_unclamped_micro_batch_names_both_fields() -> None:
    msg = refused(FGO + "overlap_scope=pre_step", FGO + "granularity=micro_batch")
    assert FGO + "overlap_scope" in msg and FGO + "granularity" in msg


def test_pre_step_with_micro_batch_that_clamps_up_is_accepted() -> None:
    # 4 samples x multiplier 64 > one mini-batch of 16 groups x 1 sample -> clamps to mini_batch
    load_config(None, [FGO + "overlap_scope=pre_step", FGO + "granularity=micro_batch", FGO + "multiplier=64"])


def test_pre_step_needs_one_epoch() -> None:
    assert "actor.ppo_epochs" in refused(
        FGO + "overlap_scope=pre_step", FGO + "granularity=mini_batch", "actor.ppo_epochs=2"
    )


def test_micro_batch_with_dynamic_bsz() -> None:
    assert "actor.use_dynamic_bsz" in refused(FGO + "granularity=micro_batch", "actor.use_dynamic_bsz=True")


def test_micro_batch_pre_step_megatron_refused_even_after_clamp() -> None:
    msg = refused(
        FGO + "overlap_scope=pre_step",
        FGO + "granularity=micro_batch",
        FGO + "multiplier=64",
        "actor.strategy=megatron",
    )
    assert "micro_batch + pre_step + megatron" in msg


def test_migration_needs_status_and_partial_rollout() -> None:
    msg = refused(
        RC + "sync_and_mig_strategy.mig.enable=True",
        RC + "sync_and_mig_strategy.mig.threshold=5",
        "psrl.status_collection.enable=False",
        RC + "partial_rollout.enable=False",
    )
    assert "psrl.status_collection.enable" in msg and RC + "partial_rollout.enable" in msg


def test_redundant_sizes_at_least_algorithm_sizes() -> None:
    msg = refused(RC + "redundant_rollout.enable=True", RC + "redundant_rollout.redundant_global_batch_size=4")
    assert "redundant_global_batch_size" in msg
    load_config(
        None,
        [
            "psrl.staleness_buffer_entries=64",
            "psrl.rollout_n=8",
            RC + "redundant_rollout.enable=True",
            RC + "redundant_rollout.redundant_global_batch_size=80",
            RC + "redundant_rollout.redundant_rollout_n=10",
        ],
    )


def test_p2p_needs_multi_version_kv() -> None:
    msg = refused("psrl.lmcache.enable=True", "psrl.lmcache.enable_p2p=True", "psrl.lmcache.multi_version_kv=False")
    assert "psrl.lmcache.multi_version_kv" in msg
    msg = refused(
        "psrl.lmcache.enable=True", "psrl.lmcache.enable_p2p=True", "psrl.lmcache.clear_on_weight_update=True"
    )
    assert "clear_on_weight_update" in msg


def test_sticky_with_sessions_needs_bucketed() -> None:
    msg = refused(
        RC + "routing_strategy.enable_trajectory_sticky=True",
        RC + "session_strategy.thunder_agent.enable=True",
        RC + "session_strategy.thunder_agent.continue_scope=global",
    )
    assert "continue_scope" in msg


def test_token_is_needs_engine_logprobs() -> None:
    msg = refused("algorithm.rollout_correction.rollout_is=token", "psrl.log_prob.enable_rollout_engine_log_prob=False")
    assert "enable_rollout_engine_log_prob" in msg


def test_status_based_needs_threshold() -> None:
    assert "sync.threshold" in refused(RC + "sync_and_mig_strategy.method=status_based")


def test_grpo_needs_groups() -> None:
    assert "psrl.rollout_n" in refused("algorithm.adv_estimator=grpo")


def test_cost_model_json_round_trip(tmp_path) -> None:
    from psrl.engine_cost.model import load_cost_model

    model = CostModel(2e-8, 0.004, 1.5e-4, 0.001, meta={"device": "cpu"})
    path = tmp_path / "m.json"
    model.save(path)
    assert load_cost_model(path) == model
    data = json.loads(path.read_text())
    data["k3"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="k3"):
        load_cost_model(path)


def test_cpu_kernels_on_refuses_what_they_do_not_run() -> None:
    assert "the CPU kernels do not run on cuda" in refused("engine.cpu_kernels=on", "topology.device=cuda")
    assert "float32 only" in refused("engine.cpu_kernels=on", "engine.dtype=bfloat16")
    load_config(None, ["engine.cpu_kernels=on", "topology.device=cpu"])


def test_on_and_off_overrides_are_the_words_not_yaml_booleans() -> None:
    config = load_config(None, ["bus.curve=on", "engine.cpu_kernels=off"])
    assert (config.bus.curve, config.engine.cpu_kernels) == ("on", "off")


def test_the_offload_tier_is_accepted_and_its_unread_settings_are_refused() -> None:
    accepted = load_config(None, ["psrl.lmcache.enable=True", "psrl.lmcache.offload_size_gb=1"])
    assert accepted.psrl.lmcache.enable
    assert "psrl.lmcache.backend" in refused("psrl.lmcache.enable=True", "psrl.lmcache.backend=disk",
                                             "psrl.lmcache.disk_path=/tmp")  # fmt: skip
    assert "psrl.lmcache.chunk_size" in refused("psrl.lmcache.enable=True", "psrl.lmcache.chunk_size=64")
    assert "save_decode_cache" in refused("psrl.lmcache.enable=True", "psrl.lmcache.save_decode_cache=False")


def test_kv_transfer_needs_the_p2p_tier() -> None:
    msg = refused(RC + "routing_strategy.kv_transfer.enable=True", RC + "partial_rollout.enable=True")
    assert "psrl.lmcache.enable_p2p" in msg


def test_hang_continue_needs_sessions() -> None:
    msg = refused(RC + "session_strategy.thunder_agent.enable=True")
    assert "env.enable" in msg


COLOCATED = "topology.colocate=true topology.device=cuda psrl.tms.range=all"


@pytest.mark.parametrize(
    "setting", ["topology.device=cpu", "engine.backend=vllm", COLOCATED, "psrl.ps.prefetch=false",
                "psrl.ps.delta_sync=true psrl.ps.transport=zmq"],
)  # fmt: skip
def test_prefetch_to_device_true_needs_a_prefetch_for_the_embedded_engine_on_its_own_gpu(setting: str) -> None:
    with pytest.raises(ConfigError, match=r"psrl\.ps\.prefetch_to_device=auto"):
        load_config("demo", ["psrl.ps.prefetch_to_device=true", *setting.split()])
    load_config("demo", ["psrl.ps.prefetch_to_device=auto", *setting.split()])  # auto: it lands nothing there


@pytest.mark.parametrize(
    "setting", ["actor.compile=false", "topology.device=cpu", "topology.n_trainer_ranks=2", COLOCATED]
)
def test_warm_up_true_needs_a_compiling_trainer_alone_with_its_memory(setting: str) -> None:
    with pytest.raises(ConfigError, match=r"actor\.warm_up=auto"):
        load_config("demo", ["actor.warm_up=true", *setting.split()])
    load_config("demo", ["actor.warm_up=auto", *setting.split()])
    load_config("demo", ["actor.warm_up=true", "topology.device=cuda"])  # compile=auto compiles on CUDA


@pytest.mark.parametrize(
    "setting", ["topology.device=cpu", "engine.backend=vllm", "engine.cuda_graphs=false", "engine.gpu_kernels=off"]
)
@pytest.mark.parametrize(("knob", "fix"), [("capture_graphs_at_start", "false"), ("capture_graphs_when_idle", "auto")])
def test_graph_capture_needs_the_embedded_engines_graph_rounds(setting: str, knob: str, fix: str) -> None:
    with pytest.raises(ConfigError, match=rf"engine\.{knob}={fix}"):
        load_config("demo", [f"engine.{knob}=true", *setting.split()])
    load_config("demo", [f"engine.{knob}=true", "topology.device=cuda"])
    if knob == "capture_graphs_when_idle":
        load_config("demo", [f"engine.{knob}=auto", *setting.split()])  # auto: where the rounds are graphs


def test_capture_when_idle_true_has_nothing_left_after_capture_at_start() -> None:
    both = ["topology.device=cuda", "engine.capture_graphs_at_start=true"]
    with pytest.raises(ConfigError, match=r"engine\.capture_graphs_when_idle=auto"):
        load_config("demo", [*both, "engine.capture_graphs_when_idle=true"])
    load_config("demo", [*both, "engine.capture_graphs_when_idle=auto"])
