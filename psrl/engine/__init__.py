"""Rollout engines: the embedded engine (continuous batching, paged KV cache, prefix cache) in torch, and
the interface both backends implement (`RolloutEngine`, chosen by `build_engine` from `engine.backend`)."""

from bus.messages import FinishReason
from psrl.assets import DEMO_MODEL_DIR
from psrl.engine.args import EngineArgs
from psrl.engine.engine import Engine
from psrl.engine.outputs import EngineStatus, RequestOutput, RequestResult, StepOutput, WaitingQueue
from psrl.engine.protocol import RolloutEngine, build_engine
from psrl.engine.sampling_params import SamplingParams

__all__ = [
    "DEMO_MODEL_DIR",
    "Engine",
    "EngineArgs",
    "EngineStatus",
    "FinishReason",
    "RequestOutput",
    "RequestResult",
    "RolloutEngine",
    "SamplingParams",
    "StepOutput",
    "WaitingQueue",
    "build_engine",
]
