"""Decode attention inside a decode loop: which form of it is cheapest on this CPU.

A 4-layer decode step of the demo model's shape (hidden 128, 4 query and 2 key/value heads of 32)
at batch 32 with 96 keys per sequence, each layer with its own weights and KV buffer, so that caches
behave as in the engine. Attention forms compared (checked to agree where they read the same buffers):

  sdpa_bool     SDPA over the engine's decode workspace (strided K/V views), bool mask (the engine)
  sdpa_float    the same with an additive float mask computed once per step
  sdpa_split    SDPA over a [K|V, rows, heads, positions, dim] buffer (contiguous per head)
  bmm_kt        baddbmm over a pre-transposed key cache, softmax, bmm
  bmm_split     baddbmm / softmax / bmm over the split buffer
  fused_c       the engine's CPU kernel (psrl.kernels): rotary embedding, the new key/value written
                to a paged cache and to the split buffer, and attention, in one call
  none          no attention: the rest of the layer alone

    .venv/bin/python tools/bench_decode_attention.py [--threads 2]

Last line: ``RESULT attention_us_per_layer_<form>=... rest_us_per_layer=...``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.nn import functional

BATCH, KV_HEADS, GROUP, HEAD_DIM, KEYS, CAPACITY, LAYERS, HIDDEN = 32, 2, 2, 32, 96, 256, 4, 128
QKV = HIDDEN + 2 * KV_HEADS * HEAD_DIM
# (layer, qkv [batch, q | k | v]) -> attention output [batch, hidden]
Attention = Callable[[int, torch.Tensor], torch.Tensor]


def time_us(step: Callable[[], torch.Tensor], repeats: int) -> float:
    for _ in range(20):
        step()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats * 1e6


def attention_forms() -> dict[str, Attention]:
    b, h, g, d, n, cap = BATCH, KV_HEADS, GROUP, HEAD_DIM, KEYS, CAPACITY
    positions = torch.randint(n // 2, n, (b,))
    positions[0] = n - 1
    allowed = (torch.arange(n).view(1, n) <= positions.view(b, 1)).view(b, 1, 1, n)
    float_mask = torch.zeros(b, 1, 1, n).masked_fill_(~allowed, float("-inf"))
    bias = float_mask.expand(b, h, g, n).reshape(b * h, g, n).contiguous()
    workspace = [torch.randn(b, cap, 2, h, d) for _ in range(LAYERS)]
    split = [torch.randn(2, b, h, cap, d) for _ in range(LAYERS)]
    keys_t = [kv[0].transpose(-1, -2).contiguous() for kv in split]  # the split keys, transposed
    scale = d**-0.5

    def sdpa_ws(mask: torch.Tensor) -> Attention:
        def run(layer: int, qkv: torch.Tensor) -> torch.Tensor:
            q = qkv[:, :HIDDEN]
            kv = workspace[layer][:, :n]
            keys, values = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            out = functional.scaled_dot_product_attention(q.view(b, h, g, d), keys, values, attn_mask=mask)
            return out.reshape(b, -1)

        return run

    def sdpa_split(layer: int, qkv: torch.Tensor) -> torch.Tensor:
        kv, q = split[layer], qkv[:, :HIDDEN].reshape(b, h, g, d)
        out = functional.scaled_dot_product_attention(q, kv[0, :, :, :n], kv[1, :, :, :n], attn_mask=float_mask)
        return out.reshape(b, -1)

    def bmm(keys_view: Callable[[int], torch.Tensor], values_view: Callable[[int], torch.Tensor]) -> Attention:
        def run(layer: int, qkv: torch.Tensor) -> torch.Tensor:
            scores = torch.baddbmm(bias, qkv[:, :HIDDEN].reshape(b * h, g, d), keys_view(layer), alpha=scale)
            return torch.bmm(torch.softmax(scores, -1), values_view(layer)).view(b, -1)

        return run

    def split_keys(i: int) -> torch.Tensor:
        return split[i][0, :, :, :n].reshape(b * h, n, d).transpose(1, 2)

    def transposed_keys(i: int) -> torch.Tensor:
        return keys_t[i][:, :, :, :n].reshape(b * h, d, n)

    def split_values(i: int) -> torch.Tensor:
        return split[i][1, :, :, :n].reshape(b * h, n, d)

    return {
        "sdpa_bool": sdpa_ws(allowed),
        "sdpa_float": sdpa_ws(float_mask),
        "sdpa_split": sdpa_split,
        "bmm_kt": bmm(transposed_keys, split_values),
        "bmm_split": bmm(split_keys, split_values),
        "fused_c": fused_kernel(split, positions),
        "none": lambda layer, qkv: qkv[:, :HIDDEN],
    }


def fused_kernel(split: list[torch.Tensor], positions: torch.Tensor) -> Attention:
    """The CPU kernel over the split buffers, with an identity rotation (cos 1, sin 0), so it reads what
    sdpa_split reads once it has written its new key/value at each sequence's position."""
    from psrl.kernels.cpu_decode import AttentionShape, CpuDecodeKernels, DecodeBatch
    from psrl.kernels.library import cpu_kernel_library

    kernels = CpuDecodeKernels(cpu_kernel_library())
    rope = torch.stack((torch.ones(CAPACITY, HEAD_DIM // 2), torch.zeros(CAPACITY, HEAD_DIM // 2)), dim=-1)
    num_slots = BATCH * CAPACITY
    caches = [torch.zeros(num_slots, 2, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
    slots = torch.arange(BATCH) * CAPACITY + positions
    shape = AttentionShape(KV_HEADS * GROUP, KV_HEADS, HEAD_DIM)
    batch = DecodeBatch(shape, rope.contiguous(), positions, slots, CAPACITY, num_slots)

    def run(layer: int, qkv: torch.Tensor) -> torch.Tensor:
        kv = split[layer]
        return kernels.decode_attention(qkv, batch, caches[layer], kv[0], kv[1])

    return run


def decode_step(attention: Attention, weights: list[dict[str, torch.Tensor]], x0: torch.Tensor) -> torch.Tensor:
    x = x0
    for layer, w in enumerate(weights):
        qkv = functional.rms_norm(x, (HIDDEN,)) @ w["qkv"]
        x = x + attention(layer, qkv) @ w["o"]
        gate, up = (functional.rms_norm(x, (HIDDEN,)) @ w["gate_up"]).chunk(2, -1)
        x = x + (functional.silu(gate) * up) @ w["down"]
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [{"qkv": torch.randn(HIDDEN, QKV) * 0.05, "o": torch.randn(HIDDEN, HIDDEN) * 0.05,
                "gate_up": torch.randn(HIDDEN, 768) * 0.05, "down": torch.randn(384, HIDDEN) * 0.05}
               for _ in range(LAYERS)]  # fmt: skip
    x0 = torch.randn(BATCH, HIDDEN)
    forms = attention_forms()
    qkv = torch.randn(BATCH, QKV)
    # same buffers, same answer: the workspace forms agree, and so do the split-buffer forms (the
    # transposed key copy only until fused_c writes its new keys into the split buffers)
    for first, second in (("sdpa_bool", "sdpa_float"), ("sdpa_split", "bmm_split"), ("sdpa_split", "bmm_kt"),
                          ("fused_c", "sdpa_split")):  # fmt: skip
        assert torch.allclose(forms[first](0, qkv), forms[second](0, qkv), atol=1e-4), (first, second)
    with torch.inference_mode():
        step_us = {
            name: time_us(lambda f=form: decode_step(f, weights, x0), args.repeats) for name, form in forms.items()
        }
    rest = step_us["none"] / LAYERS
    print(f"batch {BATCH}, {KEYS} keys, {LAYERS} layers, {args.threads} threads: microseconds per layer")
    print(f"{'form':<12} {'attention':>10} {'vs sdpa_bool':>13}")
    per_layer = {name: (us / LAYERS) - rest for name, us in step_us.items() if name != "none"}
    for name, us in per_layer.items():
        print(f"{name:<12} {us:>10.1f} {per_layer['sdpa_bool'] / us:>13.2f}")
    print(f"{'rest':<12} {rest:>10.1f}")
    fields = " ".join(f"attention_us_per_layer_{name}={us:.1f}" for name, us in per_layer.items())
    print(f"RESULT {fields} rest_us_per_layer={rest:.1f} threads={args.threads}")


if __name__ == "__main__":
    main()
