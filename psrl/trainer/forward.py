"""Forward passes that return per-response-token quantities `[B, R]` (see `psrl.rl.batch` for the layout)."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn
from torch.nn import functional

from psrl.rl.batch import Batch
from psrl.rl.losses import entropy_from_logits


def compute_precision(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[object]:
    """Forward arithmetic in ``dtype`` (autocast) when it is narrower than float32; else as the parameters are.

    Both the no-grad forwards (old and reference log-probs) and the update's forward run under it, so the
    ratio of new to old log-probs compares numbers of the same precision.
    """
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def response_logits(model: nn.Module, batch: Batch, temperature: float) -> Tensor:
    """Logits that predict each response token: positions P-1 .. P+R-2, float32, divided by temperature.

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
    model: nn.Module, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """(log-prob of each response token, entropy at each response position or None)."""
    logits = response_logits(model, batch, temperature)
    log_probs = functional.log_softmax(logits, dim=-1).gather(-1, batch.response_token_ids().unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs * batch.token_mask, None if entropy is None else entropy * batch.token_mask


def response_values(critic: nn.Module, batch: Batch) -> Tensor:
    """Critic value of the state before each response token."""
    values: Tensor = critic(batch.input_ids, batch.attention_mask, batch.position_ids)
    prompt = batch.prompt_length
    return values[:, prompt - 1 : prompt - 1 + batch.response_length] * batch.token_mask


@torch.no_grad()
def no_grad_log_probs(model: nn.Module, batch: Batch, temperature: float) -> Tensor:
    return response_log_probs(model, batch, temperature=temperature)[0]


@torch.no_grad()
def no_grad_values(critic: nn.Module, batch: Batch) -> Tensor:
    return response_values(critic, batch)
