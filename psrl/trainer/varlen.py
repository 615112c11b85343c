"""Varlen attention for the trainer's packed micro-batches, as a Hugging Face attention implementation.

A packed micro-batch is one row of whole sequences laid end to end, `cu_seqlens` marking their
boundaries; no token may attend across a boundary. The trainer keeps Hugging Face modules (the
checkpoints, LoRA wrapping, DDP/FSDP2 wrapping and gradient checkpointing all stay as they are) and
swaps only the attention function: `use_varlen_attention` sets the model's implementation to
``psrl_varlen``, registered here, which reads the boundaries from the standard varlen keyword
arguments (``cu_seq_lens_q``, ``max_length_q``) that transformers passes from the model's
``forward`` down to every attention call (and through checkpointed layers, so a recomputed layer
sees them too). A packed forward also passes `packed_attention_mask()`, a 4D placeholder that
transformers hands through as it is, so it builds no ``[tokens x tokens]`` mask; the attention
ignores it. A call without the varlen arguments (a padded batch, a plain ``model(ids)``) is
transformers' own SDPA attention with its usual mask.

The kernel, by device and dtype:

* CUDA in bf16/fp16 (autocast's dtype, or the inputs'): ``torch.nn.attention.varlen.varlen_attn``
  (FlashAttention-2 varlen, forward and backward, grouped-query heads; its signature is read at run
  time, since it changed between torch releases): work is the sum of the squared sequence lengths.
* Elsewhere (CPU, fp32): the sequences are gathered into a `[num_seqs, heads, longest, dim]` block
  and run through SDPA with ``is_causal``. Each sequence starts at offset 0 of its row, so the causal
  mask alone keeps every real query on its own real keys; the rows' tail slots are zeros whose
  outputs are dropped (so their gradients are zero). Work is num_seqs x longest^2, and the trainer
  packs sequences of similar length together. A block-diagonal mask over the whole packed row
  (transformers' own packed-sequence support) is correct too but costs tokens^2: 30x more attention
  on the CPU demo's micro-batches. FlexAttention with document masks needs ``torch.compile`` to be
  fast, which recompiles for every new packed length and is slow to build on 2 cores.

Shared prompts (`psrl.trainer.packing`): a segment's keys are not only its own tokens but a prompt
before them. The micro-batch brings a `SegmentPlan` (keyword ``psrl_segments``, built once on the
host when the batch is packed, read by every layer): each segment is a row of queries against a row
of its keys, causal from the bottom right (the last query sees every key), as SDPA with that mask,
on any device: the flash kernel takes no gathered keys here.

Under ``torch.compile`` (``actor.compile``, psrl.trainer.compiled) the attention is traced into the
layer's graph: the flash kernel is a registered custom operator with its own autograd and shape
rules, and the gathered and segment paths are plain tensor code whose sizes come from the batch's
shapes, never from its values. A layer is then one graph forward and one backward. (Left out of the
graph, it split each layer into six graphs and Python frames between them, and on a GPU a short
micro-batch's step was bound by the host running those, not by the device.) The kernel's signature,
which changed between torch releases, is read once outside any trace (``register``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VARLEN_ATTENTION = "psrl_varlen"
SEGMENTS = "psrl_segments"  # the keyword that carries a shared-prompt batch's SegmentPlan


class VarlenError(RuntimeError):
    """A packed attention call came without its sequence boundaries."""


def varlen_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """Causal attention within each packed sequence; `query` is [1, heads, tokens, dim] (HF layout).

    Returns [1, tokens, heads, dim], as transformers' SDPA implementation does."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    max_length = kwargs.get("max_length_q")
    if cu_seqlens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)  # type: ignore[arg-type]  # fmt: skip
    if not isinstance(cu_seqlens, Tensor) or not isinstance(max_length, int):
        raise VarlenError(f"cu_seq_lens_q must be a tensor and max_length_q an int; got {cu_seqlens!r}, {max_length!r}")
    if query.shape[0] != 1:
        raise VarlenError(f"a packed batch is one row; got a query of shape {tuple(query.shape)}")
    if dropout > 0.0:
        raise VarlenError("the trainer runs attention without dropout")
    plan = kwargs.get(SEGMENTS)
    if isinstance(plan, SegmentPlan):
        return _segment_sdpa(query[0], key[0], value[0], plan, scaling).unsqueeze(0), None
    flash_dtype = _flash_dtype(query)
    if flash_dtype is not None and _flash_takes(scaling, query.shape[-1]):
        q, k, v = (x[0].to(flash_dtype) for x in (query, key, value))
        out = _flash_varlen(q, k, v, cu_seqlens, max_length, scaling)
    else:
        out = _gathered_sdpa(query[0], key[0], value[0], cu_seqlens, max_length, scaling)
    return out.unsqueeze(0), None


def _flash_dtype(query: Tensor) -> torch.dtype | None:
    """The half dtype the flash kernel would run in (autocast's, else the query's), or None."""
    if not query.is_cuda or FLASH.kernel is None:
        return None
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else query.dtype
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _flash_takes(scaling: float | None, head_dim: int) -> bool:
    """This torch's varlen kernel can apply `scaling` (older ones take no scale: only the default)."""
    return "scale" in FLASH.parameters or scaling is None or abs(scaling - head_dim**-0.5) < 1e-12


def _gathered_sdpa(
    query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, max_length: int, scaling: float | None
) -> Tensor:
    """[heads, tokens, dim] -> [tokens, heads, dim] through one SDPA over the sequences as rows."""
    heads, tokens, dim = query.shape
    slots, slot_of_token = _slots(cu_seqlens, max_length, tokens)
    num_seqs = cu_seqlens.shape[0] - 1

    def rows(x: Tensor) -> Tensor:  # [h, tokens, d] -> [num_seqs, h, longest, d]; empty slots read a zero row
        padded = torch.cat([x, x.new_zeros(x.shape[0], 1, x.shape[2])], dim=1)
        return padded[:, slots.view(-1)].view(x.shape[0], num_seqs, max_length, x.shape[2]).transpose(0, 1)

    enable_gqa = key.shape[0] != heads
    out = functional.scaled_dot_product_attention(
        rows(query), rows(key), rows(value), is_causal=True, scale=scaling, enable_gqa=enable_gqa
    )
    flat = out.transpose(0, 1).reshape(heads, num_seqs * max_length, dim)
    return flat[:, slot_of_token].transpose(0, 1)


class SegmentPlan(NamedTuple):
    """Where a shared-prompt micro-batch's segments sit in the rows of one SDPA call; ``tokens`` (one past
    the packed row) marks an empty slot, which reads a zero row."""

    query_slots: Tensor  # [segments, longest segment] long: the packed position of each query slot
    slot_of_token: Tensor  # [tokens] long: the flat query slot of each packed token
    key_slots: Tensor  # [segments, most keys] long: the packed position of each key slot
    visible: Tensor  # [segments, 1, longest segment, most keys] bool: causal from the bottom right


def _segment_sdpa(query: Tensor, key: Tensor, value: Tensor, plan: SegmentPlan, scaling: float | None) -> Tensor:
    """[heads, tokens, dim] -> [tokens, heads, dim]: each query segment against its keys, one SDPA over the
    segments as rows."""
    heads, _, dim = query.shape
    num_segments, width = plan.query_slots.shape

    def rows(x: Tensor, slots: Tensor) -> Tensor:  # -> [segments, h, slots per segment, d]
        padded = torch.cat([x, x.new_zeros(x.shape[0], 1, x.shape[2])], dim=1)
        return padded[:, slots.reshape(-1)].view(x.shape[0], num_segments, slots.shape[1], x.shape[2]).transpose(0, 1)

    out = functional.scaled_dot_product_attention(
        rows(query, plan.query_slots),
        rows(key, plan.key_slots),
        rows(value, plan.key_slots),
        attn_mask=plan.visible,
        scale=scaling,
        enable_gqa=key.shape[0] != heads,
    )
    flat = out.transpose(0, 1).reshape(heads, num_segments * width, dim)
    return flat[:, plan.slot_of_token].transpose(0, 1)


def _slots(cu_seqlens: Tensor, max_length: int, tokens: int) -> tuple[Tensor, Tensor]:
    """(token index of slot [seq, offset] or `tokens` for an empty slot, slot index of each token).

    Computed on the device from `cu_seqlens` without reading it back to the host."""
    cu = cu_seqlens.to(torch.long)
    lengths = cu[1:] - cu[:-1]
    offsets = torch.arange(max_length, device=cu.device)
    slots = torch.where(offsets[None, :] < lengths[:, None], cu[:-1, None] + offsets[None, :], tokens)
    seq_of_token = torch.repeat_interleave(
        torch.arange(lengths.shape[0], device=cu.device), lengths, output_size=tokens
    )
    slot_of_token = seq_of_token * max_length + (torch.arange(tokens, device=cu.device) - cu[seq_of_token])
    return slots, slot_of_token


def _flash_varlen(
    query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, max_length: int, scaling: float | None
) -> Tensor:
    kernel, parameters = FLASH.kernel, FLASH.parameters
    if kernel is None:
        raise VarlenError("the flash varlen kernel needs a CUDA build of torch >= 2.9")
    q, k, v = (x.transpose(0, 1).contiguous() for x in (query, key, value))  # [tokens, heads, dim]
    cu = cu_seqlens.to(torch.int32)
    options: dict[str, object] = {"scale": scaling} if "scale" in parameters else {}
    if "window_size" in parameters:
        options["window_size"] = (-1, 0)  # causal
    else:
        options["is_causal"] = True
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in parameters:
            options["enable_gqa"] = True
        else:  # older torch: one key/value head per query head
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = kernel(q, k, v, cu, cu, max_length, max_length, **options)
    return out if isinstance(out, Tensor) else out[0]


class FlashKernel:
    """torch's varlen flash kernel and the names of its parameters; ``kernel`` is None without one.
    Loaded by ``register`` (outside any trace: the signature is read with ``inspect``)."""

    def __init__(self) -> None:
        self.kernel: Callable[..., Any] | None = None
        self.parameters: frozenset[str] = frozenset()

    def load(self) -> None:
        if self.kernel is not None or not torch.cuda.is_available():
            return
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            return
        self.parameters = frozenset(inspect.signature(varlen_attn).parameters)
        self.kernel = varlen_attn


FLASH = FlashKernel()  # read by the traced code as a plain global


def flash_varlen_available() -> bool:
    """torch has the varlen flash kernel (CUDA builds of torch >= 2.9)."""
    FLASH.load()
    return FLASH.kernel is not None


def register() -> None:
    FLASH.load()
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, sdpa_mask)


def packed_attention_mask(device: torch.device) -> Tensor:
    """The placeholder a packed forward passes as `attention_mask` (see the module docstring)."""
    return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)


def require_varlen(model: nn.Module) -> None:
    """Refuse a packed forward through a model whose attention would read the placeholder as a mask."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "_attn_implementation", VARLEN_ATTENTION) != VARLEN_ATTENTION:
            raise VarlenError(
                f"a packed batch through a model with {config._attn_implementation!r} attention: "
                "call psrl.trainer.varlen.use_varlen_attention(model) first"
            )


def use_varlen_attention(model: nn.Module) -> None:
    """Switch every Hugging Face config under `model` to the packed (varlen) attention."""
    register()
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = VARLEN_ATTENTION
