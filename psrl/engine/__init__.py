"""The embedded rollout engine (continuous batching, paged KV cache, prefix cache) in torch."""

from psrl.engine.args import DEMO_MODEL_DIR, EngineArgs
from psrl.engine.engine import Engine
from psrl.engine.outputs import EngineStatus, RequestOutput, RequestResult, StepOutput
from psrl.engine.sampling_params import SamplingParams
from psrl.engine.sequence import FinishReason

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
