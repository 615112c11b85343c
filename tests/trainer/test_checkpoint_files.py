"""Checkpoints as Hugging Face directories, the dataset cursor, pruning, and token-budgeted micro-batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from psrl.assets import DEMO_MODEL_DIR
from psrl.rl.batch import Sample
from psrl.trainer import TrainerCore
from psrl.trainer.checkpoint import latest_checkpoint, read_trainer_state
from psrl.trainer.update import sample_tokens, split_to_count, token_budget_batches

from .trainer_helpers import make_buffer, trainer_config


def test_policy_directory_loads_in_transformers_as_it_is(tmp_path: Path) -> None:
    # regression: the final checkpoint had no tokenizer, so AutoTokenizer gave an empty one
    config = trainer_config([f"model.path={DEMO_MODEL_DIR}"])
    core = TrainerCore(config)
    core.train_buffer(0, make_buffer(0))
    policy = core.save_checkpoint(tmp_path) / "policy"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):  # fmt: skip
        assert (policy / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(policy)
    original = AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    assert len(tokenizer) == len(original) > 10
    assert tokenizer.encode("add 12 34=") == original.encode("add 12 34=")
    assert tokenizer.eos_token == original.eos_token
    loaded = AutoModelForCausalLM.from_pretrained(policy).eval()
    ids = torch.tensor([tokenizer.encode("sort 3102=")])
    with torch.no_grad():
        expected = core.policy.raw(ids).logits
        assert torch.allclose(loaded(ids).logits, expected, atol=1e-5)


def test_chat_template_travels_with_the_tokenizer(tmp_path: Path) -> None:
    tokenizer_dir = tmp_path / "tok"
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(tokenizer_dir)
    core = TrainerCore(trainer_config([f"model.path={DEMO_MODEL_DIR}", f"model.tokenizer_path={tokenizer_dir}"]))
    policy = core.save_checkpoint(tmp_path / "ckpt") / "policy"
    reloaded = AutoTokenizer.from_pretrained(policy)
    assert reloaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user]hi"


def test_checkpoint_records_the_prompt_cursor_and_keeps_the_newest(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
    for buffer in range(3):
        core.train_buffer(buffer, make_buffer(buffer))
        core.save_checkpoint(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000003"]
    state = read_trainer_state(latest_checkpoint(tmp_path))  # type: ignore[arg-type]
    assert state["next_prompt_id"] == 2 * 100 + 4  # make_buffer(2) holds prompts 200..203
    resumed = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
    resumed.load_checkpoint(latest_checkpoint(tmp_path))  # type: ignore[arg-type]
    assert resumed.next_prompt_id == 204


def test_a_half_trained_recompute_buffer_is_dropped_for_a_stop_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = TrainerCore(trainer_config(["psrl.fine_grain_overlap.granularity=mini_batch"]), model_dir=tiny_model_dir)
    core.train_buffer(0, make_buffer(0))
    core.add_chunk(1, make_buffer(1)[:4], is_last=False)
    assert core.has_partial_buffer and core.discard_partial_buffer()
    assert core.save_checkpoint(tmp_path).name == "step_00000001"


def test_token_budget_micro_batches() -> None:
    samples = [Sample(t) for t in make_buffer(0, num_groups=4)]
    parts = token_budget_batches(samples, 24)
    assert sorted(map(id, (s for p in parts for s in p))) == sorted(map(id, samples))
    packed = [sample_tokens(s) for p in parts for s in p]
    assert packed == sorted(packed), "rows of similar length share a micro-batch"
    for part in parts:
        rows = len(part)
        longest = max(len(s.trajectory.prompt_token_ids) for s in part) + max(
            s.trajectory.num_response_tokens for s in part
        )
        assert rows == 1 or rows * longest <= 24
    assert len(token_budget_batches(samples, 10_000)) == 1
    assert len(token_budget_batches(samples, 1)) == len(samples)
    evened = split_to_count(parts[:2], 5)
    assert len(evened) == min(5, len(parts[0]) + len(parts[1]))
    assert [s for p in evened for s in p] == parts[0] + parts[1]


@pytest.mark.parametrize("budget", [16, 40])
def test_dynamic_batch_size_takes_the_same_step(tiny_model_dir: Path, budget: int) -> None:
    static = TrainerCore(trainer_config(["actor.ppo_micro_batch_size_per_gpu=8"]), model_dir=tiny_model_dir)
    dynamic = TrainerCore(trainer_config(["actor.use_dynamic_bsz=True", f"actor.ppo_max_token_len_per_gpu={budget}"]),
                          model_dir=tiny_model_dir)  # fmt: skip
    assert dynamic.settings.max_tokens_per_micro_batch == budget
    for core in (static, dynamic):
        core.train_buffer(0, make_buffer(0))
    a, b = dict(static.named_weights()), dict(dynamic.named_weights())
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
