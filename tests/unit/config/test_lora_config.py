"""`actor.lora.*`: off by default, every bad value refused naming the field, the value and the fix; LoRA on
either backend, and `engine.lora_mode` refused where it does not apply."""

from __future__ import annotations

import pytest

from psrl.config import load_config
from psrl.config.training import LORA_TARGETS
from psrl.errors import ConfigError


def test_off_by_default_and_the_adapters_rate_defaults_to_ten_times_actor_lr() -> None:
    default = load_config("demo")
    assert not default.actor.lora.enabled and default.actor.lora.policy_lr(1e-4) == 1e-4
    lora = load_config("demo", ["actor.lora.rank=16", "actor.lr=2e-4"]).actor.lora
    assert lora.enabled and lora.target_modules == LORA_TARGETS and lora.scaling == 2.0
    assert lora.policy_lr(2e-4) == pytest.approx(2e-3)
    assert load_config("demo", ["actor.lora.rank=16", "actor.lora.lr=5e-5"]).actor.lora.policy_lr(2e-4) == 5e-5


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("actor.lora.rank=-1", "use a value >= 0"),
        ("actor.lora.alpha=0", "use a value > 0"),
        ("actor.lora.dropout=1", "use a value < 1"),
        ("actor.lora.lr=0", "use a value > 0"),
        ("actor.lora.target_modules=[q_proj,qkv_proj]", "use names from"),
        ("actor.lora.target_modules=[q_proj,q_proj]", "each once"),
        ("actor.lora.target_modules=[]", "each once"),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_fix(override: str, fix: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config("demo", ["actor.lora.rank=8", override])
    text = str(raised.value)
    field, _, value = override.partition("=")
    assert field in text and value.strip("[]").split(",")[-1] in text and fix in text


def test_lora_runs_on_either_backend_and_lora_mode_only_where_it_applies() -> None:
    # delta sync: the vLLM backend writes each adapter version whole from the held adapters
    vllm = load_config("demo", ["actor.lora.rank=8", "engine.backend=vllm", "psrl.ps.delta_sync=true"])
    assert vllm.actor.lora.enabled and vllm.psrl.ps.delta_sync
    assert load_config("demo", ["actor.lora.rank=8", "engine.lora_mode=unmerged"]).engine.lora_mode == "unmerged"
    for overrides, fix in (
        (["engine.lora_mode=unmerged"], "set actor.lora.rank > 0"),
        (["actor.lora.rank=8", "engine.lora_mode=unmerged", "engine.backend=vllm"], "engine.lora_mode=merge"),
    ):
        with pytest.raises(ConfigError) as raised:
            load_config("demo", overrides)
        assert "engine.lora_mode" in str(raised.value) and fix in str(raised.value)
