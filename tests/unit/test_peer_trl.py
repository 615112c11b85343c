"""The peer benchmark's pure parts (tools/peer_trl.py): the shared workload, step timing and the RESULT line.

The `trl`-marked test needs TRL's venv (`make test-trl`): TRL's own GRPOConfig takes the arguments
and reads them back as the same batch shape psrl trains with.
"""

import math

import pytest

from psrl.config import load_config
from tools.peer_trl import (
    RESULT_KEYS,
    Workload,
    edge_means,
    format_result,
    median,
    parse_result,
    result_values,
    step_timing,
    trl_config_kwargs,
    workload_from_config,
)


def demo_workload(steps: int = 7) -> Workload:
    return workload_from_config(load_config("demo", [f"trainer.total_steps={steps}"]), "model-dir")


def test_the_workload_is_read_from_psrls_configuration() -> None:
    config = load_config("demo", ["trainer.total_steps=7", "actor.lr=0.001"])
    work = workload_from_config(config, "model-dir")
    assert work.steps == 7 and work.lr == 0.001
    assert work.groups == config.psrl.staleness_buffer_entries and work.group_size == config.psrl.rollout_n
    assert work.updates_per_step * work.mini_batch_groups == work.groups
    assert Workload.from_dict(work.to_dict()) == work  # crosses to the TRL process as JSON


def test_trl_gets_one_generation_batch_per_psrl_step() -> None:
    work = demo_workload()
    kwargs = trl_config_kwargs(work, "out", threads=2, device="cpu")
    generation_batch = kwargs["per_device_train_batch_size"] * kwargs["steps_per_generation"]
    assert generation_batch == work.groups * work.group_size
    assert kwargs["max_steps"] == work.steps * kwargs["steps_per_generation"]
    assert kwargs["learning_rate"] == work.lr and kwargs["lr_scheduler_type"] == "constant"
    assert (kwargs["adam_beta1"], kwargs["adam_beta2"]) == work.betas
    assert kwargs["max_completion_length"] == work.max_response_length
    assert kwargs["top_k"] == 0 and not kwargs["shuffle_dataset"]


def test_step_timing_from_step_end_times() -> None:
    start, ends = 100.0, [112.0, 112.5, 113.5, 113.9]
    timing = step_timing(start, list(reversed(ends)))
    assert timing.first_step_s == ends[0] - start
    assert timing.s_per_step == pytest.approx(median([0.5, 1.0, 0.4]))
    assert timing.mean_s_per_step == pytest.approx((113.9 - 112.0) / 3)  # the throughput, bursts included
    assert math.isnan(step_timing(start, []).s_per_step)


def test_edges_and_median_ignore_what_is_missing() -> None:
    values = [float(i) for i in range(12)]
    assert edge_means(values) == (sum(values[:5]) / 5, sum(values[-5:]) / 5)
    assert median([3.0, math.nan, 1.0]) == 2.0
    assert math.isnan(median([]))


def test_result_line_ratios_and_round_trip() -> None:
    medians = {
        "trl": {"s_per_step": 0.6, "mean_s_per_step": 0.6, "wall_s": 30.0, "first_step_s": 2.0, "acc": 0.25},
        "sync": {"s_per_step": 0.5, "mean_s_per_step": 0.5, "wall_s": 40.0, "first_step_s": 12.0, "acc": 0.2},
        "async": {"s_per_step": 0.4, "mean_s_per_step": 0.5, "wall_s": 36.0, "first_step_s": 11.0, "acc": 0.3},
    }
    values = result_values(medians)
    assert values["speedup_vs_trl_sync"] == pytest.approx(0.6 / 0.5)  # TRL's s/step over psrl's
    assert values["speedup_vs_trl_async"] == pytest.approx(0.6 / 0.4)
    assert values["throughput_vs_trl_async"] == pytest.approx(0.6 / 0.5)  # mean intervals
    assert values["wall_vs_trl"] == pytest.approx(36.0 / 30.0)  # psrl's whole command over TRL's
    line = format_result(values)
    assert list(parse_result(line))[: len(RESULT_KEYS)] == list(RESULT_KEYS)
    assert parse_result(line) == pytest.approx({k: round(v, 3) for k, v in values.items()})
    with pytest.raises(ValueError):
        parse_result("speedup=1")


@pytest.mark.trl
# transformers 5 deprecates `gradient_checkpointing` (TRL's own config field) with a FutureWarning on every config
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_trls_config_takes_the_arguments() -> None:
    trl = pytest.importorskip("trl")
    work = demo_workload()
    config = trl.GRPOConfig(**trl_config_kwargs(work, "/tmp/unused", threads=2, device="cpu"))
    assert config.generation_batch_size == work.groups * work.group_size
    assert config.num_generations == work.group_size and config.max_steps == work.steps * work.updates_per_step


def test_trls_mixed_precision_follows_psrls_compute_dtype_on_the_device() -> None:
    config = load_config("demo", [])
    on_cpu, on_cuda = workload_from_config(config, "m"), workload_from_config(config, "m", device="cuda")
    assert (on_cpu.compute_dtype, on_cuda.compute_dtype) == ("float32", "bfloat16")  # actor.compute_dtype=auto
    assert not trl_config_kwargs(on_cpu, "/tmp/unused", threads=2, device="cpu")["bf16"]
    assert trl_config_kwargs(on_cuda, "/tmp/unused", threads=2, device="cuda")["bf16"]
    pinned = workload_from_config(load_config("demo", ["actor.compute_dtype=float32"]), "m", device="cuda")
    assert not trl_config_kwargs(pinned, "/tmp/unused", threads=2, device="cuda")["bf16"]
    assert Workload.from_dict(on_cuda.to_dict()) == on_cuda


def test_model_is_demo_smollm2_or_a_directory_with_a_config(tmp_path) -> None:
    from psrl.assets import DEMO_MODEL_DIR
    from tools.bench_peer_trl import resolve_model

    assert resolve_model("demo") == str(DEMO_MODEL_DIR)
    assert resolve_model(str(DEMO_MODEL_DIR)) == str(DEMO_MODEL_DIR)
    assert resolve_model(str(tmp_path)) is None  # no config.json: not a model


def test_the_psrl_command_it_starts_runs() -> None:
    import subprocess

    from tools.bench_peer_trl import psrl_cli

    done = subprocess.run([*psrl_cli(), "launch", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "--root" in done.stdout
