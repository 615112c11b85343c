"""Forward passes that return per-response-token quantities `[B, R]` (see `psrl.rl.batch` for the layout).

A micro-batch is either padded (`Batch`: rows of left-padded prompts and right-padded responses,
the attention mask hides the padding) or packed (`PackedBatch`: one row of whole sequences, no
padding, varlen attention; see `psrl.trainer.packing`). Both give the same `[B, R]` results.

Packed log-probs and entropy never materialise the `[tokens x vocab]` logits: the final hidden
states at the positions that predict a response token go through the LM head in chunks
(`psrl.trainer.logprob`). That needs the LM head as a plain weight, so an FSDP2-sharded model or a
head that is not a bias-free `nn.Linear` gets the model's own head on those positions instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional

from psrl.rl.batch import Batch
from psrl.rl.losses import entropy_from_logits
from psrl.trainer.logprob import fused_log_probs, reference_log_probs
from psrl.trainer.packing import PackedBatch
from psrl.trainer.varlen import require_varlen

MicroBatch = Batch | PackedBatch


def compute_precision(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[object]:
    """Forward arithmetic in ``dtype`` (autocast) when it is narrower than float32; else as the parameters are.

    Both the no-grad forwards (old and reference log-probs) and the update's forward run under it, so the
    ratio of new to old log-probs compares numbers of the same precision.
    """
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def padded_of(micro: MicroBatch) -> Batch:
    """The padded per-token tensors (masks, fields) of a micro-batch."""
    return micro.batch if isinstance(micro, PackedBatch) else micro


def response_logits(model: nn.Module, batch: Batch, temperature: float) -> Tensor:
    """Logits that predict each response token of a padded batch: positions P-1 .. P+R-2, float32,
    divided by temperature.

    Responses are right-aligned at the end of every row, so only the last R+1 positions are
    projected onto the vocabulary (`logits_to_keep`), which saves the prompt's share of the LM head.
    """
    num_response = batch.response_length
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=num_response + 1,
    )
    logits: Tensor = output.logits[:, :-1, :].float()
    return logits / temperature if temperature not in (0.0, 1.0) else logits


def response_log_probs(
    model: nn.Module, micro: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """(log-prob of each response token, entropy at each response position or None), both [B, R]."""
    if isinstance(micro, PackedBatch):
        return _packed_log_probs(model, micro, temperature, with_entropy)
    logits = response_logits(model, micro, temperature)
    log_probs = functional.log_softmax(logits, dim=-1).gather(-1, micro.response_token_ids().unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs * micro.token_mask, None if entropy is None else entropy * micro.token_mask


def _packed_log_probs(
    model: nn.Module, packed: PackedBatch, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    raw = _unwrapped(model)
    require_varlen(raw)
    head = fusable_head(model)
    if head is not None:
        with _final_hidden_states(raw) as captured:
            model(**packed.model_kwargs(), logits_to_keep=packed.logit_positions[:0])
        hidden = captured[0][0].index_select(0, packed.logit_positions)
        log_probs, entropy = fused_log_probs(hidden, head.weight, packed.targets, temperature=temperature or 1.0,
                                             with_entropy=with_entropy)  # fmt: skip
    else:
        logits = model(**packed.model_kwargs(), logits_to_keep=packed.logit_positions).logits[0].float()
        if temperature not in (0.0, 1.0):
            logits = logits / temperature
        log_probs, entropy = reference_log_probs(logits, packed.targets, with_entropy=with_entropy)
    return packed.to_padded(log_probs), None if entropy is None else packed.to_padded(entropy)


def fusable_head(model: nn.Module) -> nn.Linear | None:
    """The LM head when the fused log-prob can use its weight directly, else None."""
    if _is_fsdp(model):
        return None
    get_head = getattr(_unwrapped(model), "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if type(head) is nn.Linear and head.bias is None:
        return head
    return None


@contextlib.contextmanager
def _final_hidden_states(raw: nn.Module) -> Iterator[list[Tensor]]:
    """Capture the decoder's output (the hidden states the LM head reads) during one forward."""
    captured: list[Tensor] = []

    def hook(_module: nn.Module, _args: object, output: object) -> None:
        hidden = getattr(output, "last_hidden_state", None)
        captured.append(hidden if isinstance(hidden, Tensor) else output[0])  # type: ignore[index]

    handle = raw.get_decoder().register_forward_hook(hook)  # type: ignore[operator]
    try:
        yield captured
    finally:
        handle.remove()


def _unwrapped(model: nn.Module) -> nn.Module:
    module = getattr(model, "module", None)  # DistributedDataParallel
    return module if isinstance(module, nn.Module) else model


def _is_fsdp(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(model, FSDPModule)


def response_values(critic: nn.Module, micro: MicroBatch) -> Tensor:
    """Critic value of the state before each response token, [B, R]."""
    if isinstance(micro, PackedBatch):
        require_varlen(_unwrapped(critic))
        kwargs = micro.model_kwargs()
        kwargs.pop("use_cache")
        ids, mask, positions = kwargs.pop("input_ids"), kwargs.pop("attention_mask"), kwargs.pop("position_ids")
        values: Tensor = critic(ids, mask, positions, **kwargs)
        return micro.to_padded(values[0].index_select(0, micro.logit_positions))
    values = critic(micro.input_ids, micro.attention_mask, micro.position_ids)
    prompt = micro.prompt_length
    return values[:, prompt - 1 : prompt - 1 + micro.response_length] * micro.token_mask


@torch.no_grad()
def no_grad_log_probs(model: nn.Module, micro: MicroBatch, temperature: float) -> Tensor:
    return response_log_probs(model, micro, temperature=temperature)[0]


@torch.no_grad()
def no_grad_values(critic: nn.Module, micro: MicroBatch) -> Tensor:
    return response_values(critic, micro)
