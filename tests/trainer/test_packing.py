"""Padding-free packed micro-batches: the plan, the layout, the varlen attention, and packed == padded steps.

On the CPU, packed micro-batches share each group's prompt (actor.share_prompts=auto), so the packed ==
padded steps check the shared layout; ``whole_sequences`` checks the packing without it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from psrl.rl.batch import Sample
from psrl.rl.trajectory import Trajectory
from psrl.trainer import TrainerCore
from psrl.trainer.models import load_policy
from psrl.trainer.packing import micro_batch_count, pack, plan_packed, sample_tokens
from psrl.trainer.varlen import VarlenError, use_varlen_attention

from .trainer_helpers import VOCAB, make_buffer, trainer_config

ESTIMATORS = ["grpo", "rloo", "gae", "reinforce_plus_plus"]
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def samples_of(lengths: list[tuple[int, int]], seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i, (p, r) in enumerate(lengths):
        prompt = tuple(rng.randrange(2, VOCAB) for _ in range(p))
        response = tuple(rng.randrange(2, VOCAB) for _ in range(r))
        out.append(Sample(Trajectory(prompt_id=i, child=0, prompt_token_ids=prompt, response_token_ids=response,
                                     rollout_log_probs=tuple(-3.0 for _ in response), token_versions=(0,) * r,
                                     version=0, reward=0.0)))  # fmt: skip
    return out


class TestPlan:
    def test_every_sample_once_and_balanced_by_tokens(self) -> None:
        rng = random.Random(3)
        samples = samples_of([(rng.randint(2, 20), rng.randint(0, 200)) for _ in range(40)])
        parts = plan_packed(samples, 4, max_tokens=None)
        assert sorted(id(s) for p in parts for s in p) == sorted(id(s) for s in samples)
        loads = [sum(sample_tokens(s) for s in p) for p in parts]
        # LPT: the heaviest exceeds the mean by less than the longest sample
        assert max(loads) - sum(loads) / len(loads) < max(sample_tokens(s) for s in samples)
        assert len(parts) == 4

    def test_token_budget_holds_and_a_longer_sample_goes_alone(self) -> None:
        samples = samples_of([(4, 10), (4, 30), (4, 300), (4, 5), (4, 50), (4, 12)])
        count = micro_batch_count(samples, max_tokens=64, micro_batch_size=2)
        parts = plan_packed(samples, count, max_tokens=64)
        for part in parts:
            tokens = sum(sample_tokens(s) for s in part)
            assert tokens <= 64 or len(part) == 1
        assert [len(p) for p in parts if sum(sample_tokens(s) for s in p) > 64] == [1]

    def test_without_a_budget_as_many_micro_batches_as_fixed_sizes(self) -> None:
        samples = samples_of([(3, n) for n in range(1, 10)])
        assert micro_batch_count(samples, max_tokens=None, micro_batch_size=4) == 3
        assert len(plan_packed(samples, 5, max_tokens=None)) == 5  # a data-parallel peer needs 5


class TestLayout:
    def test_positions_restart_and_logits_positions_predict_the_response(self) -> None:
        samples = samples_of([(3, 2), (2, 0), (4, 3)])
        packed = pack(samples, pad_token_id=0)
        assert packed.input_ids.shape == (1, 14)
        assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 4, 5, 6]
        assert packed.cu_seqlens.tolist() == [0, 5, 7, 14]
        ids = packed.input_ids[0]
        # the position before each response token predicts it
        assert ids[packed.logit_positions + 1].tolist() == packed.targets.tolist()
        assert packed.targets.tolist() == [*samples[0].trajectory.response_token_ids,
                                           *samples[2].trajectory.response_token_ids]  # fmt: skip
        padded = packed.to_padded(torch.arange(1.0, 6.0))
        assert padded.tolist() == [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [3.0, 4.0, 5.0]]


def group_of(prompt_id: int, prompt_length: int, response_lengths: list[int], seed: int = 0) -> list[Sample]:
    """Samples that share one prompt, as a GRPO group does."""
    rng = random.Random(seed * 100 + prompt_id)
    prompt = tuple(rng.randrange(2, VOCAB) for _ in range(prompt_length))
    out = []
    for child, r in enumerate(response_lengths):
        response = tuple(rng.randrange(2, VOCAB) for _ in range(r))
        out.append(Sample(Trajectory(prompt_id=prompt_id, child=child, prompt_token_ids=prompt,
                                     response_token_ids=response, rollout_log_probs=tuple(-3.0 for _ in response),
                                     token_versions=(0,) * r, version=0, reward=0.0)))  # fmt: skip
    return out


class TestSharedPrompts:
    def mixed(self) -> list[Sample]:
        samples = [*group_of(0, 5, [3, 1, 0, 6]), *group_of(1, 3, [2]), *group_of(2, 7, [4, 4])]
        random.Random(1).shuffle(samples)  # a group's samples need not be neighbours
        return samples

    def test_each_prompt_once_and_each_response_sees_its_whole_sequence(self) -> None:
        samples = self.mixed()
        packed = pack(samples, pad_token_id=0, share_prompts=True)
        assert packed.num_tokens == 5 + 3 + 7 + (3 + 1 + 6) + 2 + (4 + 4)  # the lone sample is packed whole
        plan = packed.segments
        assert plan is not None
        ids, positions = packed.input_ids[0], packed.position_ids[0]
        keys = [row[row < packed.num_tokens] for row in plan.key_slots]
        sequences = {tuple(ids[k].tolist()): positions[k].tolist() for k in keys}
        for s in samples:
            whole = (*s.trajectory.prompt_token_ids, *s.trajectory.response_token_ids)
            if s.trajectory.num_response_tokens:  # each response's keys are its prompt, then itself
                assert sequences[whole] == list(range(len(whole)))
        # query j of a segment with q queries and k keys sees keys 0 .. k - q + j: its own position and before
        for queries, visible, k in zip(plan.query_slots, plan.visible[:, 0], keys, strict=True):
            q = int((queries < packed.num_tokens).sum())
            assert visible[:q].sum(1).tolist() == [len(k) - q + j + 1 for j in range(q)]
        # the position that predicts each response token holds the token before it in its own sequence
        flat = packed.to_padded(ids[packed.logit_positions].float())
        for row, s in enumerate(samples):
            whole = (*s.trajectory.prompt_token_ids, *s.trajectory.response_token_ids)
            before = whole[len(s.trajectory.prompt_token_ids) - 1 : -1]
            assert flat[row, : len(before)].tolist() == [float(t) for t in before]
        assert packed.targets.tolist() == packed.batch.response_token_ids().flatten()[packed.response_slots].tolist()

    def test_no_shared_prompt_packs_as_before(self) -> None:
        samples = samples_of([(3, 2), (2, 0), (4, 3)])
        shared, whole = pack(samples, pad_token_id=0, share_prompts=True), pack(samples, pad_token_id=0)
        assert shared.segments is None
        for name in ("input_ids", "position_ids", "cu_seqlens", "logit_positions", "targets", "response_slots"):
            assert torch.equal(getattr(shared, name), getattr(whole, name)), name

    def test_a_mask_over_the_cap_packs_whole_sequences(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from psrl.trainer import packing

        samples = self.mixed()
        plan = pack(samples, 0, share_prompts=True).segments
        assert plan is not None
        entries = plan.visible.numel()
        monkeypatch.setattr(packing, "MAX_SHARED_MASK_ENTRIES", entries - 1)
        capped, whole = pack(samples, 0, share_prompts=True), pack(samples, 0)
        assert capped.segments is None and torch.equal(capped.input_ids, whole.input_ids)
        monkeypatch.setattr(packing, "MAX_SHARED_MASK_ENTRIES", entries)
        shared = pack(samples, 0, share_prompts=True)
        assert shared.segments is not None and shared.num_tokens < whole.num_tokens

    def test_log_probs_and_gradients_equal_the_whole_sequences(self, tiny_model_dir: Path) -> None:
        from psrl.trainer.forward import response_log_probs

        model = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"))
        use_varlen_attention(model)
        samples = self.mixed()
        results = []
        for share in (False, True):
            log_probs, entropy = response_log_probs(model, pack(samples, 0, share_prompts=share), with_entropy=True)
            assert entropy is not None
            grads = torch.autograd.grad((log_probs * 0.3 + entropy).sum(), list(model.parameters()))
            results.append((log_probs, entropy, grads))
        (lp_a, en_a, g_a), (lp_b, en_b, g_b) = results
        torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(en_b, en_a, atol=1e-5, rtol=1e-5)
        for a, b in zip(g_a, g_b, strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)

    def test_the_plan_keeps_a_prompts_samples_together(self) -> None:
        samples = [*group_of(0, 4, [2, 9, 1]), *group_of(1, 6, [5, 5]), *group_of(2, 2, [3, 3, 3, 3])]
        parts = plan_packed(samples, 2, max_tokens=None, share_prompts=True)
        assert sorted(id(s) for p in parts for s in p) == sorted(id(s) for s in samples)
        for part in parts:
            ids = {s.trajectory.prompt_id for s in part}
            assert all(sum(s.trajectory.prompt_id == i for s in part) == sum(s.trajectory.prompt_id == i
                       for s in samples) for i in ids)  # fmt: skip
        # a group over the token budget is placed sample by sample
        big = group_of(3, 4, [20, 20, 20])
        assert max(len(p) for p in plan_packed(big, 3, max_tokens=30, share_prompts=True)) == 1

    def test_auto_shares_on_the_cpu_and_a_padded_trainer_cannot(self) -> None:
        from psrl.errors import ConfigError

        actor = trainer_config().actor
        assert actor.share_prompts == "auto" and actor.share_prompts_on("cpu") and not actor.share_prompts_on("cuda")
        assert trainer_config(["actor.share_prompts=true"]).actor.share_prompts_on("cuda")
        assert not trainer_config(["actor.packing=false"]).actor.share_prompts_on("cpu")
        with pytest.raises(ConfigError, match=r"actor\.share_prompts"):
            trainer_config(["actor.packing=false", "actor.share_prompts=true"])

    def test_auto_budgets_micro_batches_in_tokens_on_cuda_when_packed(self) -> None:
        actor = trainer_config().actor
        assert actor.use_dynamic_bsz == "auto"
        assert actor.dynamic_bsz_on("cuda", micro_batch_chunks=False)
        assert not actor.dynamic_bsz_on("cpu", micro_batch_chunks=False)
        assert not actor.dynamic_bsz_on("cuda", micro_batch_chunks=True)  # chunks sized in samples
        assert not trainer_config(["actor.packing=false"]).actor.dynamic_bsz_on("cuda", micro_batch_chunks=False)
        assert trainer_config(["actor.use_dynamic_bsz=true"]).actor.dynamic_bsz_on("cpu", micro_batch_chunks=False)


class TestVarlenAttention:
    def test_packed_forward_equals_each_sequence_alone(self, tiny_model_dir: Path) -> None:
        model = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"))
        samples = samples_of([(3, 5), (6, 1), (2, 9), (5, 4)])
        alone = [model(input_ids=torch.tensor([[*s.trajectory.prompt_token_ids, *s.trajectory.response_token_ids]]))
                 .logits[0] for s in samples]  # fmt: skip
        use_varlen_attention(model)
        packed = pack(samples, pad_token_id=0)
        logits = model(**packed.model_kwargs()).logits[0]
        torch.testing.assert_close(logits, torch.cat(alone), atol=2e-5, rtol=1e-5)

    def test_no_token_attends_across_a_boundary(self, tiny_model_dir: Path) -> None:
        model = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"))
        use_varlen_attention(model)
        samples = samples_of([(3, 5), (4, 4)])
        changed = samples_of([(3, 5), (4, 4)], seed=9)  # other tokens everywhere
        first = pack([samples[0], samples[1]], pad_token_id=0)
        other = pack([changed[0], samples[1]], pad_token_id=0)
        out_first = model(**first.model_kwargs()).logits[0, 8:]
        out_other = model(**other.model_kwargs()).logits[0, 8:]
        torch.testing.assert_close(out_first, out_other, atol=1e-6, rtol=0)

    def test_plain_forwards_still_work_and_packed_needs_the_varlen_model(self, tiny_model_dir: Path) -> None:
        model = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"))
        ids = torch.tensor([[5, 6, 7, 8]])
        expected = model(input_ids=ids).logits
        use_varlen_attention(model)
        torch.testing.assert_close(model(input_ids=ids).logits, expected)
        plain = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"))
        from psrl.trainer.forward import response_log_probs

        with pytest.raises(VarlenError, match="use_varlen_attention"):
            response_log_probs(plain, pack(samples_of([(2, 2)]), pad_token_id=0))


def captured_steps(core: TrainerCore, buffers: int) -> list[dict[str, object]]:
    """Per optimizer step: the policy's (and critic's) gradients before the step, and the metrics."""
    steps: list[dict[str, object]] = []
    for trainable in [core.policy] + ([core.critic] if core.critic is not None else []):

        def record(optimizer: torch.optim.Optimizer, *_: object, name: str = trainable.name) -> None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            steps.append({f"{name}:{i}": p.grad.clone() for i, p in enumerate(params) if p.grad is not None})

        trainable.optimizer.register_step_pre_hook(record)
    metrics = [core.train_buffer(b, make_buffer(b)).metrics for b in range(buffers)]
    return [*steps, *({"metrics": m} for m in metrics)]


def assert_same_steps(packed: list[dict[str, object]], padded: list[dict[str, object]]) -> None:
    assert len(packed) == len(padded)
    for a, b in zip(packed, padded, strict=True):
        if "metrics" in a:
            ma, mb = a["metrics"], b["metrics"]
            assert isinstance(ma, dict) and isinstance(mb, dict)
            for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm", "critic/vf_loss",
                        "rollout/log_prob_abs_diff", "actor/kl_loss"):  # fmt: skip
                if key in mb:
                    assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-5), key
            continue
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_packed_step_equals_padded_step(tiny_model_dir: Path, estimator: str, aggregation: str) -> None:
    overrides = [f"algorithm.adv_estimator={estimator}", f"algorithm.loss_agg_mode={aggregation}",
                 "algorithm.entropy_coeff=0.01", "actor.ppo_micro_batch_size_per_gpu=3"]  # fmt: skip
    packed = TrainerCore(trainer_config([*overrides, "actor.packing=True"]), model_dir=tiny_model_dir)
    padded = TrainerCore(trainer_config([*overrides, "actor.packing=False"]), model_dir=tiny_model_dir)
    assert_same_steps(captured_steps(packed, 1), captured_steps(padded, 1))


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor.share_prompts=false"],
        ["actor.share_prompts=false", "algorithm.adv_estimator=gae"],
        ["algorithm.policy_loss.loss_mode=gspo", "algorithm.loss_agg_mode=seq-mean-token-mean"],
        ["algorithm.policy_loss.loss_mode=cispo"],
        ["algorithm.kl_loss_coef=0.1", "algorithm.kl_loss_type=low_var_kl"],
        ["actor.use_dynamic_bsz=True", "actor.ppo_max_token_len_per_gpu=24", "task.temperature=0.7"],
        ["actor.gradient_checkpointing=True"],
    ],
    ids=["whole_sequences", "whole_sequences_gae", "gspo", "cispo", "kl_loss", "token_budget", "checkpointed"],
)
def test_packed_step_equals_padded_step_for_the_other_losses(tiny_model_dir: Path, overrides: list[str]) -> None:
    packed = TrainerCore(trainer_config([*overrides, "actor.packing=True"]), model_dir=tiny_model_dir)
    padded = TrainerCore(trainer_config([*overrides, "actor.packing=False"]), model_dir=tiny_model_dir)
    assert_same_steps(captured_steps(packed, 2), captured_steps(padded, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_packed_step_equals_padded_step_on_the_gpu_in_bf16(tiny_model_dir: Path, estimator: str) -> None:
    overrides = [f"algorithm.adv_estimator={estimator}", "actor.compute_dtype=bfloat16", "topology.device=cuda",
                 "actor.ppo_micro_batch_size_per_gpu=3"]  # fmt: skip
    from psrl.trainer.parallel import ParallelContext

    cuda = ParallelContext(device=torch.device("cuda"))
    packed = TrainerCore(trainer_config([*overrides, "actor.packing=True"]), model_dir=tiny_model_dir, parallel=cuda)
    padded = TrainerCore(trainer_config([*overrides, "actor.packing=False"]), model_dir=tiny_model_dir, parallel=cuda)
    a, b = captured_steps(packed, 1), captured_steps(padded, 1)
    for x, y in zip(a, b, strict=True):
        if "metrics" in x:
            continue
        for name in x:
            assert_same_direction(x[name], y[name], name)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shared_prompts_on_the_gpu_give_the_padded_step(tiny_model_dir: Path) -> None:
    from psrl.trainer.parallel import ParallelContext

    overrides = ["actor.compute_dtype=bfloat16", "topology.device=cuda", "actor.ppo_micro_batch_size_per_gpu=3"]
    cuda = ParallelContext(device=torch.device("cuda"))
    shared = TrainerCore(trainer_config([*overrides, "actor.share_prompts=true"]), model_dir=tiny_model_dir,
                         parallel=cuda)  # fmt: skip
    padded = TrainerCore(trainer_config([*overrides, "actor.packing=False"]), model_dir=tiny_model_dir, parallel=cuda)
    assert shared.settings.share_prompts
    for x, y in zip(captured_steps(shared, 1), captured_steps(padded, 1), strict=True):
        for name in () if "metrics" in x else x:
            assert_same_direction(x[name], y[name], name)  # type: ignore[arg-type]


def assert_same_direction(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    """bf16 matmuls: gradients agree in direction and size. Both exactly zero is agreement too: the
    critic's backbone gets none from a first step through its zero-initialised value head."""
    ga, gb = a.float().flatten(), b.float().flatten()
    if not ga.any() and not gb.any():
        return
    assert torch.nn.functional.cosine_similarity(ga, gb, dim=0) > 0.99, name
    assert float(ga.norm()) == pytest.approx(float(gb.norm()), rel=0.05), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flash_varlen_equals_the_gathered_sdpa_path() -> None:
    from psrl.trainer.varlen import _flash_varlen, _gathered_sdpa, flash_varlen_available

    assert flash_varlen_available()
    torch.manual_seed(0)
    lengths = [17, 130, 1, 64]
    tokens = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    q = torch.randn(8, tokens, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, tokens, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, tokens, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fast = _flash_varlen(q, k, v, cu, max(lengths), None)
    grads_fast = torch.autograd.grad(fast.float().square().sum(), (q, k, v))
    slow = _gathered_sdpa(q, k, v, cu, max(lengths), None)
    grads_slow = torch.autograd.grad(slow.float().square().sum(), (q, k, v))
    torch.testing.assert_close(fast, slow, atol=2e-2, rtol=2e-2)
    for a, b in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_the_unfused_head_path_gives_the_same_step(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # FSDP2-sharded models and heads that are not a plain Linear project the kept positions with the model's head
    from psrl.trainer import forward

    monkeypatch.setattr(forward, "fusable_head", lambda _model: None)
    overrides = ["algorithm.entropy_coeff=0.01", "task.temperature=0.8"]
    packed = TrainerCore(trainer_config([*overrides, "actor.packing=True"]), model_dir=tiny_model_dir)
    padded = TrainerCore(trainer_config([*overrides, "actor.packing=False"]), model_dir=tiny_model_dir)
    assert_same_steps(captured_steps(packed, 1), captured_steps(padded, 1))


def test_checkpointing_by_memory_budget(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psrl.trainer import memory

    core = TrainerCore(trainer_config(), model_dir=tiny_model_dir)  # actor.gradient_checkpointing=auto
    policy = core.checkpointing["policy"]
    assert policy.mode == "auto" and policy.bytes_per_token > 0
    core.train_buffer(0, make_buffer(0))
    assert policy.micro_batches > 0 and policy.checkpointed == 0  # a tiny model fits in memory
    monkeypatch.setattr(memory, "free_bytes", lambda _device: 1.0)  # nothing free: every micro-batch recomputes
    calls = []
    layer = policy.layers[0]
    real = layer._gradient_checkpointing_func
    monkeypatch.setattr(layer, "_gradient_checkpointing_func", lambda *a, **k: calls.append(1) or real(*a, **k))
    core.train_buffer(1, make_buffer(1))
    assert policy.checkpointed == policy.micro_batches - policy.checkpointed > 0
    assert calls  # the layer really was recomputed
    assert not any(layer.gradient_checkpointing for layer in policy.layers)  # off again after the update


def test_the_fewest_layers_that_fit_are_recomputed() -> None:
    from psrl.trainer.memory import layers_to_recompute

    assert layers_to_recompute(100.0, 1.0, 10, budget=100.0) == 0  # fits: nothing recomputed
    assert layers_to_recompute(100.0, 1.0, 10, budget=90.0) == 2  # each recomputed layer frees 9
    assert layers_to_recompute(100.0, 1.0, 10, budget=10.0) == 10  # the least it can keep is 10
    assert layers_to_recompute(100.0, 1.0, 10, budget=1.0) == 10  # does not fit at all: every layer


def test_a_tight_budget_recomputes_some_layers_and_trains_the_same(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from psrl.trainer import memory

    reference = TrainerCore(trainer_config(["actor.gradient_checkpointing=False"]), model_dir=tiny_model_dir)
    partial = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
    policy = partial.checkpointing["policy"]
    real = memory.layers_to_recompute  # a budget of 3/4 of each micro-batch's activations
    monkeypatch.setattr(memory, "layers_to_recompute", lambda act, kept, n, _budget: real(act, kept, n, 0.75 * act))
    assert 0 < policy.layers_to_recompute(64, torch.device("cpu")) < len(policy.layers)
    for buffer_id in range(2):
        expected = reference.train_buffer(buffer_id, make_buffer(buffer_id)).metrics["actor/pg_loss"]
        assert partial.train_buffer(buffer_id, make_buffer(buffer_id)).metrics["actor/pg_loss"] == pytest.approx(
            expected, rel=1e-5, abs=1e-6
        )
    assert policy.checkpointed > 0 and policy.layers_recomputed < policy.checkpointed * len(policy.layers)


def test_ranks_take_one_group_a_round_balanced_by_tokens() -> None:
    from psrl.trainer.core import round_owners

    loads = [0, 0]
    assert round_owners([10, 50], loads) == [1, 0] and loads == [50, 10]  # largest to the lightest (rank 0 on a tie)
    assert round_owners([40, 5], loads) == [1, 0] and loads == [55, 50]  # rank 1 is lighter now: the 40 goes there
    loads = [0, 0, 0]
    owners = round_owners([7, 7, 7], loads)
    assert sorted(owners) == [0, 1, 2] and owners == [0, 1, 2]  # ties: arrival order to rank order


def test_two_ranks_share_every_mini_batch_evenly_and_by_tokens(tiny_model_dir: Path) -> None:
    from psrl.trainer.parallel import ParallelContext

    buffer = make_buffer(0, num_groups=8)
    owned = []
    for rank in (0, 1):
        core = TrainerCore(trainer_config(["psrl.staleness_buffer_entries=8"]), model_dir=tiny_model_dir)
        core.parallel = ParallelContext(rank=rank, world_size=2)  # ownership only: no collective runs
        state = core._state_for(0)
        core._add_groups(state, [buffer[i : i + 2] for i in range(0, 16, 2)])
        owned.append([g[0].trajectory.prompt_id for g in state.own])
    assert len(owned[0]) == len(owned[1]) == 4
    assert sorted(owned[0] + owned[1]) == sorted({t.prompt_id for t in buffer})
    for start in (0, 1, 2, 3):  # every round of two groups: one each
        round_ids = {buffer[4 * start].prompt_id, buffer[4 * start + 2].prompt_id}
        assert {owned[0][start], owned[1][start]} == round_ids
