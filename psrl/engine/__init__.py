"""The embedded rollout engine (continuous batching, paged KV cache, prefix cache) in torch."""

from bus.messages import FinishReason
from psrl.engine.args import DEMO_MODEL_DIR, EngineArgs
from psrl.engine.engine import Engine
from psrl.engine.outputs import EngineStatus, RequestOutput, RequestResult, StepOutput
from psrl.engine.sampling_params import SamplingParams

__all__ = [
    "DEMO_MODEL_DIR",
    "Engine",
    "EngineArgs",
    "EngineStatus",
    "FinishReason",
    "RequestOutput",
    "RequestResult",
    "SamplingParams",
    "StepOutput",
]
