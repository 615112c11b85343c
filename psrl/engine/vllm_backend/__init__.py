"""The vLLM rollout backend (`engine.backend=vllm`, the `vllm` extra), behind the rollout engine interface.

Importing this package does not import vLLM; building a `VllmEngine` does.
"""

from psrl.engine.vllm_backend.args import VllmEngineArgs
from psrl.engine.vllm_backend.availability import vllm_unavailable
from psrl.engine.vllm_backend.engine import VllmEngine

__all__ = ["VllmEngine", "VllmEngineArgs", "vllm_unavailable"]
