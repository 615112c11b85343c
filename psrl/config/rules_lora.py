"""Cross-field rules of LoRA (`actor.lora.*`): what the adapters need from the rest of the run."""

from __future__ import annotations

from collections.abc import Iterator

from psrl.config.root import Config
from psrl.errors import ConfigProblem


def lora_needs_embedded_engine(c: Config) -> Iterator[ConfigProblem]:
    """The rollout side merges each pulled adapter version into its base weights; only the embedded
    engine does that today (the vLLM backend would need its weight loader to merge, or vLLM's own
    LoRA serving: enable_lora with a LoRARequest per version)."""
    if c.actor.lora.enabled and c.engine.backend == "vllm":
        yield ConfigProblem(
            ("actor.lora.rank", "engine.backend"),
            repr((c.actor.lora.rank, c.engine.backend)),
            "LoRA adapters are merged on load by the embedded engine; the vLLM backend cannot apply them yet",
            "set engine.backend=embedded, or actor.lora.rank=0 (full fine-tuning)",
        )


LORA_RULES = (lora_needs_embedded_engine,)
