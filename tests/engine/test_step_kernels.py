"""The Triton step kernels against the eager path (the torch reference built from the model's own functions).

On a GPU (`gpu` marker) every kernel runs on random inputs of every head layout the engine serves
(the test models' and the published Qwen2.5 0.5B / 1.5B / 7B shapes), in fp32 and bf16. Without a
GPU, where Triton is installed, the fp32 cases of the small layouts run in Triton's interpreter.

Tolerances: fp32 results must agree to float rounding (1e-5 relative). In bf16 both sides round
every stored element to 8 significant bits; a different fp32 summation order can move a value
across a rounding boundary, so elementwise results may differ by one bf16 step (2^-8 relative,
checked at 1e-2), and attention, whose probabilities are rounded to bf16 before the value product
(as FlashAttention does) while the reference keeps them in fp32, to 1e-2 in relative norm.
"""

from __future__ import annotations

import pytest
import torch

from psrl.kernels.packed import PackedPrefill

ON_GPU = torch.cuda.is_available()
# without a GPU the kernels run in Triton's interpreter (tests/engine/conftest.py sets TRITON_INTERPRET)
triton = pytest.importorskip("triton", reason="the step kernels need Triton")

from psrl.kernels.gpu import triton_decode_attention  # noqa: E402
from psrl.models.reference_step import TorchStepKernels  # noqa: E402
from psrl.models.step_kernels import load_step_kernels  # noqa: E402

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
# (query heads, kv heads, head_dim, hidden, intermediate): test models, Qwen2.5 0.5B, 1.5B, 7B
LAYOUTS = [(4, 2, 16, 64, 160), (14, 2, 64, 896, 4864), (12, 2, 128, 1536, 8960), (28, 4, 128, 3584, 18944)]
CASES = [
    pytest.param(layout, dtype, marks=[] if ON_GPU or (dtype == torch.float32 and layout[2] <= 64) else [_skip])
    for layout in LAYOUTS
    for dtype in (torch.float32, torch.bfloat16)
    for _skip in [pytest.mark.skip(reason="interpreter: fp32 and small layouts only (bf16 products need a GPU)")]
]
pytestmark = [pytest.mark.gpu] if ON_GPU else []


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    return load_step_kernels("triton", DEVICE)


REFERENCE = TorchStepKernels()


def _randn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tolerance, atol=tolerance)


def _close_in_norm(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(got).all()
    error = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert error < (1e-5 if dtype == torch.float32 else 1e-2), error


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_norms_and_activation_match_eager(kernels, layout: tuple, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    hidden_size, inter = layout[3], layout[4]
    for rows in (1, 7, 130):
        hidden, delta = _randn(rows, hidden_size, dtype=dtype), _randn(rows, hidden_size, dtype=dtype)
        weight = _randn(hidden_size, dtype=dtype)
        for with_delta in (False, True):
            got_hidden, want_hidden = hidden.clone(), hidden.clone()
            got, want = torch.full_like(hidden, float("nan")), torch.empty_like(hidden)
            kernels.add_rms_norm(got_hidden, delta if with_delta else None, weight, 1e-6, got)
            REFERENCE.add_rms_norm(want_hidden, delta if with_delta else None, weight, 1e-6, want)
            assert torch.equal(got_hidden, want_hidden)  # the residual add rounds exactly as the eager add
            _close(got, want, dtype)
        gate_up = _randn(rows, 2 * inter, dtype=dtype, scale=3.0)
        _close(kernels.silu_mul(gate_up), REFERENCE.silu_mul(gate_up), dtype)


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_rotary_and_cache_write_match_eager(kernels, layout: tuple, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    num_heads, num_kv_heads, head_dim = layout[:3]
    num_tokens, num_blocks, block_size, positions_max = 37, 20, 16, 4096
    angles = torch.rand(positions_max, head_dim // 2, device=DEVICE) * 6.3
    rope = torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).contiguous()
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
    positions = torch.randint(0, positions_max, (num_tokens,), device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    caches = [torch.zeros(num_blocks, block_size, 2, num_kv_heads, head_dim, dtype=dtype, device=DEVICE) for _ in "ab"]
    got, want = qkv.clone(), qkv.clone()
    kernels.rotary_kv_write(got, rope, positions, slots, caches[0], num_heads)
    REFERENCE.rotary_kv_write(want, rope, positions, slots, caches[1], num_heads)
    _close(got[:, : num_heads * head_dim], want[:, : num_heads * head_dim], dtype)
    _close(caches[0], caches[1], dtype)


def test_decode_slots_match_eager(kernels) -> None:  # type: ignore[no-untyped-def]
    rows, width, block_size = 70, 9, 16
    positions = torch.randint(0, 140, (rows,), dtype=torch.int32, device=DEVICE)
    tables = torch.randint(0, 500, (rows, width), dtype=torch.int32, device=DEVICE)
    num_blocks = torch.randint(0, width + 1, (rows,), dtype=torch.int32, device=DEVICE)
    for step in (0, 5):
        got = kernels.decode_slots(positions, step, tables, num_blocks, (block_size, 777, 130))
        want = REFERENCE.decode_slots(positions, step, tables, num_blocks, (block_size, 777, 130))
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.long(), b.long())


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_decode_attention_matches_eager(kernels, layout: tuple, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    num_heads, num_kv_heads, head_dim = layout[:3]
    block_size = 16
    long = 3000 if ON_GPU else 700
    for batch in (1, 5, 64) if ON_GPU else (1, 5):
        lengths = torch.randint(1, long, (batch,), device=DEVICE)
        lengths[0] = long  # one sequence long enough for every split
        width = (long + block_size - 1) // block_size
        num_blocks = batch * width + 1
        cache = _randn(num_blocks, block_size, 2, num_kv_heads, head_dim, dtype=dtype)
        tables = torch.stack([torch.randperm(num_blocks, device=DEVICE)[:width] for _ in range(batch)]).int()
        qkv = _randn(batch, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
        want = REFERENCE.decode_attention(qkv, cache, tables, lengths.int(), num_heads)
        for splits in sorted({1, 4, triton_decode_attention.num_splits(batch, num_kv_heads, kernels.num_sms)}):
            got = triton_decode_attention.decode_attention(qkv, cache, tables, lengths.int(), num_heads, splits)
            _close_in_norm(got, want, dtype)
        _close_in_norm(kernels.decode_attention(qkv, cache, tables, lengths.int(), num_heads), want, dtype)


@pytest.mark.parametrize(("layout", "dtype"), CASES)
def test_prefill_attention_matches_eager(kernels, layout: tuple, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    num_heads, num_kv_heads, head_dim = layout[:3]
    block_size = 16
    # new tokens per sequence and positions already cached (chunked prefill, prefix-cache hits)
    query_lens, contexts = ([5, 130, 1, 64], [0, 40, 300, 16]) if ON_GPU else ([5, 70, 1], [0, 9, 30])
    width = max(c + q for c, q in zip(contexts, query_lens, strict=True)) // block_size + 1
    num_blocks = len(query_lens) * width + 1
    cache = _randn(num_blocks, block_size, 2, num_kv_heads, head_dim, dtype=dtype)
    tables = torch.stack([torch.randperm(num_blocks, device=DEVICE)[:width] for _ in query_lens])
    num_tokens = sum(query_lens)
    lens = torch.tensor(query_lens, device=DEVICE)
    starts = torch.cumsum(lens, 0) - lens
    seq_index = torch.repeat_interleave(torch.arange(len(query_lens), device=DEVICE), lens)
    prefill = PackedPrefill(
        block_tables=tables,
        context_starts=torch.tensor(contexts, device=DEVICE),
        query_starts=starts,
        query_lens=lens,
        query_lens_list=query_lens,
        seq_index=seq_index,
        offset_in_seq=torch.arange(num_tokens, device=DEVICE) - starts[seq_index],
        slot_mapping=torch.zeros(num_tokens, dtype=torch.long, device=DEVICE),
    )
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
    got = kernels.prefill_attention(qkv, cache, prefill, num_heads)
    _close_in_norm(got, REFERENCE.prefill_attention(qkv, cache, prefill, num_heads), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_matches_eager(kernels, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    if dtype == torch.bfloat16 and not ON_GPU:
        pytest.skip("interpreter: fp32 only")
    rows, vocab = (64, 151936) if ON_GPU else (6, 9000)
    logits = _randn(rows, vocab, dtype=dtype, scale=4.0)
    temperatures = torch.rand(rows, device=DEVICE) * 1.5
    temperatures[::4] = 0.0  # greedy rows
    seeds = torch.randint(-(2**31), 2**31, (2, rows), dtype=torch.int32, device=DEVICE)
    counters = torch.randint(0, 2**40, (rows,), device=DEVICE)
    got_tokens, want_tokens = (torch.empty(rows, dtype=torch.int64, device=DEVICE) for _ in "ab")
    got_logprobs, want_logprobs = (torch.empty(rows, device=DEVICE) for _ in "ab")
    kernels.sample(logits, temperatures, seeds, counters, got_tokens, got_logprobs)
    REFERENCE.sample(logits, temperatures, seeds, counters, want_tokens, want_logprobs)
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got_logprobs, want_logprobs, rtol=0, atol=1e-4)
