"""Cross-field rules of LoRA (`actor.lora.*`, `engine.lora_mode`): what the adapters need from the rest of the run.

Both backends serve adapter versions: the embedded engine merges them into its base weights or applies
them unmerged (`engine.lora_mode`), the vLLM backend through vLLM's own LoRA support (whether the
installed vLLM serves the rank is checked by `psrl.preflight`, which imports it).
"""

from __future__ import annotations

from collections.abc import Iterator

from psrl.config.root import Config
from psrl.errors import ConfigProblem


def lora_mode_applies(c: Config) -> Iterator[ConfigProblem]:
    """engine.lora_mode=unmerged only means something to the embedded engine serving a LoRA run."""
    if c.engine.lora_mode != "unmerged":
        return
    if not c.actor.lora.enabled:
        yield ConfigProblem(("engine.lora_mode", "actor.lora.rank"), repr("unmerged"),
                            "adapters are applied only in a LoRA run (actor.lora.rank=0 trains every weight)",
                            "set actor.lora.rank > 0, or engine.lora_mode=merge")  # fmt: skip
    elif c.engine.backend == "vllm":
        yield ConfigProblem(("engine.lora_mode", "engine.backend"), repr("unmerged"),
                            "engine.lora_mode is the embedded engine's; vLLM always applies adapters unmerged itself",
                            "set engine.lora_mode=merge (the default), or engine.backend=embedded")  # fmt: skip


LORA_RULES = (lora_mode_applies,)
