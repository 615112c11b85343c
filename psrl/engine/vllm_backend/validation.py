"""`engine.vllm_args` and the typed engine fields, checked by vLLM itself before any actor starts.

Each key must be a field of vLLM's `EngineArgs` that psrl does not set itself; then vLLM builds its
full engine configuration from them (reading the model's config.json, as the rollout instances
will), and whatever it refuses is reported against the psrl field it came from. On a CPU, vLLM's
attention backend is also asked whether it supports the block size and the model's head size,
which vLLM itself only checks once the KV cache is allocated. Importing vLLM takes seconds, so
this runs only when engine.backend=vllm. Under actor.lora, the rank must be one vLLM serves and a
refusal that only the LoRA arguments cause (a device or dtype vLLM's LoRA does not cover) is
reported against actor.lora.rank.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from psrl.config.loader import NAME_CUTOFF
from psrl.engine.lora_merge import LoraServing
from psrl.engine.vllm_backend.args import LORA_OWNED, OWNED, VllmEngineArgs
from psrl.engine.vllm_backend.lora import max_lora_rank, vllm_lora_ranks
from psrl.errors import ConfigProblem

if TYPE_CHECKING:
    from psrl.config import Config

ARGS = "engine.vllm_args."


def vllm_problems(config: Config) -> list[ConfigProblem]:
    from vllm.engine.arg_utils import EngineArgs

    problems = list(_key_problems(config.engine.vllm_args, {f.name for f in dataclasses.fields(EngineArgs)}))
    args = VllmEngineArgs.from_config(config)
    problems += _lora_problems(args.lora, {f.name for f in dataclasses.fields(EngineArgs)})
    if problems:
        return problems
    try:
        vllm_config = EngineArgs(**args.engine_kwargs()).create_engine_config()
    except Exception as error:  # anything vLLM refuses while building its configuration
        return [_lora_refusal(error, args) or _refusal(error, config.engine.vllm_args)]
    return list(_cpu_attention_problems(vllm_config, args))


def _lora_problems(lora: LoraServing | None, known: set[str]) -> list[ConfigProblem]:
    """actor.lora with a vLLM that has no LoRA serving, or a rank beyond the largest it serves."""
    if lora is None:
        return []
    ranks = vllm_lora_ranks() if "enable_lora" in known else ()
    if not ranks:
        fix = "install a vLLM with LoRA support (the vllm extra), or set engine.backend=embedded"
        return [ConfigProblem(("actor.lora.rank", "engine.backend"), repr(lora.rank),
                              "this vLLM has no LoRA serving (enable_lora, vllm.config.lora)", fix)]  # fmt: skip
    if max_lora_rank(lora.rank, ranks) is None:
        return [ConfigProblem(("actor.lora.rank",), repr(lora.rank),
                              f"vLLM serves LoRA ranks up to {max(ranks)} (max_lora_rank: {list(ranks)})",
                              f"set actor.lora.rank <= {max(ranks)}, or engine.backend=embedded")]  # fmt: skip
    return []


def _lora_refusal(error: Exception, args: VllmEngineArgs) -> ConfigProblem | None:
    """When vLLM accepts the configuration without LoRA, its refusal is of LoRA here (device, dtype, model)."""
    from vllm.engine.arg_utils import EngineArgs

    if args.lora is None:
        return None
    try:
        EngineArgs(**dataclasses.replace(args, lora=None).engine_kwargs()).create_engine_config()
    except Exception:
        return None
    message = " ".join(str(error).split())
    return ConfigProblem(("actor.lora.rank", "engine.backend"), repr(args.lora.rank),
                         f"vLLM cannot serve LoRA adapters with this configuration: {message[:600]}",
                         "set engine.backend=embedded (it applies adapters itself), or actor.lora.rank=0")  # fmt: skip


def _key_problems(vllm_args: dict[str, Any], known: set[str]) -> Iterator[ConfigProblem]:
    for key, value in vllm_args.items():
        if key in OWNED or key in LORA_OWNED:
            owner = {**OWNED, **LORA_OWNED}[key]
            fix = f"set {owner} instead" if not owner.startswith("fixed") else "remove it"
            yield ConfigProblem((ARGS + key,), repr(value), f"psrl sets this vLLM argument ({owner})", fix)
        elif key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=NAME_CUTOFF)  # close names only
            fix = f"did you mean {' or '.join(ARGS + c for c in close)}?" if close else "see vLLM's EngineArgs"
            yield ConfigProblem((ARGS + key,), repr(value), "not a vLLM engine argument", fix)


def _refusal(error: Exception, vllm_args: dict[str, Any]) -> ConfigProblem:
    """vLLM's error, reported against the psrl field whose value it names."""
    message = " ".join(str(error).split())
    path = "engine.vllm_args"
    owned = {**OWNED, **LORA_OWNED}
    for key in [*vllm_args, *owned]:
        if re.search(rf"\b{re.escape(key)}\b", message):
            path = ARGS + key if key in vllm_args else owned[key]
            break
    value = vllm_args.get(path.removeprefix(ARGS), "") if path.startswith(ARGS) else ""
    return ConfigProblem((path,), repr(value), f"vLLM refuses the engine configuration: {message[:600]}",
                         "change the named field (vLLM's message says how)")  # fmt: skip


def _cpu_attention_problems(vllm_config: Any, args: VllmEngineArgs) -> Iterator[ConfigProblem]:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # another vLLM layout: vLLM reports these when it allocates the KV cache
        return
    if not CPUAttentionBackend.supports_block_size(args.block_size):
        sizes = CPUAttentionBackend.get_supported_kernel_block_sizes()
        yield ConfigProblem(("engine.block_size",), repr(args.block_size),
                            f"vLLM's CPU attention does not support it (supported: {sizes})",
                            "set engine.block_size=32 (or another supported size)")  # fmt: skip
    head_size = vllm_config.model_config.get_head_size()
    if not CPUAttentionBackend.supports_head_size(head_size):
        yield ConfigProblem(("model.path",), repr(str(args.model_path)),
                            f"vLLM's CPU attention does not support head size {head_size} "
                            f"(supported: {CPUAttentionBackend.get_supported_head_sizes()})",
                            "use a model with a supported head size, or engine.backend=embedded")  # fmt: skip
