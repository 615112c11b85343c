"""The trainer's models: the policy, a frozen reference, and the critic.

All load a Hugging Face checkpoint directory (config.json + safetensors) with transformers.

Critic choice: a *second model* with the policy's architecture (the backbone, `AutoModel`, loaded
from the same checkpoint) plus a zero-initialised scalar head, so the first values are exactly 0
and the critic's optimisation never perturbs the policy. Sharing the policy backbone would halve
memory but couples the two losses; separate models keep `vf_coef` and `critic.lr` independent.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.utils.checkpoint
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

from psrl.log import get_logger
from psrl.trainer.lora import LoraSettings, adapter_names, apply_lora, has_lora

VALUE_HEAD_FILE = "value_head.safetensors"


def use_low_overhead_attention(device: torch.device) -> None:
    """Keep SDPA off its cuDNN backend in this (trainer) process.

    On an H200 a profiled real-scale step spent 8 s of host time in cuDNN attention calls (2.5 ms
    each, forward and backward, against about 0.5 ms of GPU time): micro-batches of varying padded
    lengths make it plan again and again, and the step was bound by the host, not the GPU. The
    flash and memory-efficient kernels launch in microseconds.
    """
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def load_policy(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    lora: LoraSettings | None = None,
    *,
    role: str = "policy",
) -> PreTrainedModel:
    """The policy; with ``lora``, adapters on its target projections and every base weight frozen."""
    use_low_overhead_attention(device)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    _loaded(role, model_dir)
    module: nn.Module = model
    if lora is not None:
        apply_lora(module, lora)
    module.to(device)
    module.train(False)  # no dropout: log-probs must be those of the deterministic policy
    return model


def _loaded(what: str, model_dir: str | Path) -> None:
    """One line per checkpoint read from disk (a launch reads each model once: a test counts them)."""
    get_logger("psrl.trainer").info("model_loaded", what=what, path=str(model_dir))


def synced_names(model: nn.Module) -> set[str]:
    """The tensors a pushed version consists of: the adapters under LoRA (the base never changes), else
    every persistent parameter and buffer."""
    return set(adapter_names(model)) if has_lora(model) else set(model.state_dict().keys())


def enable_gradient_checkpointing(model: nn.Module) -> int:
    """Checkpoint every transformer layer of ``model``; returns how many layers.

    transformers checkpoints a layer only while that layer is in training mode, and the trainer keeps
    its models in eval mode so that no dropout changes the log-probs. Only the layer modules
    themselves are flagged as training (their children, dropout included, stay in eval mode), so
    checkpointing applies and the numbers stay those of the deterministic policy.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.gradient_checkpointing = True
        checkpoint = partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
        layer._gradient_checkpointing_func = checkpoint  # type: ignore[assignment]
        layer.training = True  # this module only: .train() would switch its dropout children on too
    return len(layers)


def load_reference(model_dir: str | Path, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    model = load_policy(model_dir, dtype, device, role="reference")
    model.requires_grad_(False)
    return model


class ValueModel(nn.Module):
    """A transformer backbone and a linear value head: one value per position."""

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = int(backbone.config.hidden_size)
        self.value_head = nn.Linear(hidden, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor, **attention: object
    ) -> Tensor:
        """`attention`: the varlen keywords of a packed batch (psrl.trainer.packing), passed to the backbone."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **attention
        ).last_hidden_state
        values: Tensor = self.value_head(hidden).squeeze(-1).float()
        return values

    def save(self, directory: Path, state_dict: dict[str, Tensor]) -> None:
        """Write the backbone in Hugging Face layout and the head next to it."""
        backbone_state = {k.removeprefix("backbone."): v for k, v in state_dict.items() if k.startswith("backbone.")}
        head_state = {
            k.removeprefix("value_head."): v.contiguous() for k, v in state_dict.items() if k.startswith("value_head.")
        }
        self.backbone.save_pretrained(str(directory), state_dict=backbone_state)
        save_file(head_state, str(directory / VALUE_HEAD_FILE))


def load_critic(model_dir: str | Path, dtype: torch.dtype, device: torch.device) -> ValueModel:
    """A critic from a policy checkpoint (fresh head) or from a saved critic (with its head)."""
    backbone = AutoModel.from_pretrained(str(model_dir), dtype=dtype)
    _loaded("critic", model_dir)
    critic = ValueModel(backbone)
    head_path = Path(model_dir) / VALUE_HEAD_FILE
    if head_path.exists():
        critic.value_head.load_state_dict(load_file(str(head_path)))
    critic.to(device)
    critic.eval()
    return critic


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def pad_token_id(model: PreTrainedModel) -> int:
    """Padding id for batches: the config's pad token, else EOS, else 0 (padding is always masked out)."""
    for candidate in (model.config.pad_token_id, model.config.eos_token_id):
        if isinstance(candidate, int):
            return candidate
        if isinstance(candidate, list) and candidate:
            return int(candidate[0])
    return 0
