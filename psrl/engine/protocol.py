"""The rollout engine interface: what a rollout instance needs from an engine backend.

Two backends implement it: the embedded engine (`psrl.engine.Engine`) and vLLM
(`psrl.engine.vllm_backend.VllmEngine`, the `vllm` extra). `build_engine` picks one from
`engine.backend`. Every method is called from the rollout actor's one thread, between steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as SequenceLike
from typing import TYPE_CHECKING, Any, Protocol

from psrl.engine.engine import WeightSource
from psrl.engine.outputs import EngineStatus, RequestResult, StepOutput, WaitingQueue
from psrl.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from psrl.config import Config


class RolloutEngine(Protocol):
    """Continuous-batching generation with per-token log-probs and weight versions.

    - `add_request` raises RequestError (and changes nothing) for an invalid request;
      `prior_*` continue a request from tokens an earlier run generated (max_tokens counts them).
    - `step` returns the tokens one engine step produced, each stamped with `weight_version`;
      nothing while paused.
    - `abort` returns exactly the tokens generated so far (prior ones included), or None.
    - `load_weights` replaces weights in place (no restart) and, by default, drops the prefix cache.
    """

    weight_version: int

    def add_request(
        self,
        request_id: str,
        prompt_ids: SequenceLike[int],
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        *,
        prior_output_ids: SequenceLike[int] | None = None,
        prior_logprobs: SequenceLike[float] | None = None,
        prior_versions: SequenceLike[int] | None = None,
    ) -> None: ...

    def abort(self, request_id: str) -> RequestResult | None: ...

    def has_unfinished_requests(self) -> bool: ...

    def capture_when_idle(self) -> bool: ...

    def step(self) -> StepOutput: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def load_weights(self, weights: WeightSource, version: int, *, reset_prefix_cache: bool = True) -> int: ...

    def reset_prefix_cache(self) -> None: ...

    def status(self) -> EngineStatus: ...

    def waiting_queue(self) -> WaitingQueue: ...


def build_engine(config: Config) -> RolloutEngine:
    """The engine `engine.backend` names, built from the run configuration."""
    if config.engine.backend == "vllm":
        from psrl.engine.vllm_backend import VllmEngine, VllmEngineArgs

        return VllmEngine(VllmEngineArgs.from_config(config))
    from psrl.engine.args import EngineArgs
    from psrl.engine.engine import Engine
    from psrl.tms import ROLLOUT
    from psrl.tms.backend import side_memory

    return Engine(EngineArgs.from_config(config), memory=side_memory(config, ROLLOUT))
