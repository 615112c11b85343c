"""The simulator's models of what is not an engine: the trainer, the weight sync, and the run settings."""

from __future__ import annotations

from dataclasses import dataclass, replace

from psrl.errors import ConfigError, ConfigProblem
from psrl.routing.policies.balance import mix64


@dataclass(frozen=True)
class TrainerModel:
    """Seconds a trainer spends on a buffer: ``step_s + token_s * response tokens``.

    Chunks of a buffer (fine-grain overlap) are charged ``token_s`` per token as they arrive and
    the last one also ``step_s`` (the optimizer step, the push and the checkpoint). After the push,
    ``publish_s`` passes before the parameter server announces the version.
    """

    step_s: float
    token_s: float
    publish_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("step_s", "token_s", "publish_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise _problem(f"trainer.{name}", value, "must be a number >= 0")

    def chunk_time(self, num_tokens: int, *, is_last: bool) -> float:
        return self.token_s * num_tokens + (self.step_s if is_last else 0.0)


@dataclass(frozen=True)
class PullModel:
    """Seconds one weight pull (and load) takes: drawn from measured pulls, or a constant.

    Pull times vary between instances and versions, and that matters: the first instance to
    finish its pull gets every request the router holds. Each draw is a pure function of
    (seed, instance, version), so a run is reproducible.
    """

    samples_s: tuple[float, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.samples_s or not all(s >= 0 for s in self.samples_s):
            raise _problem("pull_s", self.samples_s, "needs at least one pull time, all >= 0")

    @classmethod
    def constant(cls, seconds: float) -> PullModel:
        return cls((seconds,))

    def pull_time(self, instance_index: int, version: int) -> float:
        if len(self.samples_s) == 1:
            return self.samples_s[0]
        return self.samples_s[mix64(self.seed, instance_index * 1_000_003 + version) % len(self.samples_s)]

    @property
    def mean_s(self) -> float:
        return sum(self.samples_s) / len(self.samples_s)


@dataclass(frozen=True)
class SimSettings:
    """What a simulated run needs beyond the psrl config: fleet size, trainer and sync models."""

    trainer: TrainerModel
    pull: PullModel
    num_instances: int | None = None  # None: topology.n_rollout_instances
    total_steps: int | None = None  # None: trainer.total_steps
    max_sim_s: float = 1e7  # the run is stopped (an error) if simulated time passes this
    prompt_tokens: int | None = None  # fixed prompt length; None: the task's prompts through its tokenizer
    observation_tokens: int = 32  # each modelled environment step's reply, in tokens (sessions)
    context_limit: int | None = None  # None: the configured model's and engine's context limit
    engine_slowdown: float = 1.0  # engine steps take this many times the cost model's time (shared CPUs, ...)

    def __post_init__(self) -> None:
        if self.num_instances is not None and self.num_instances < 1:
            raise _problem("num_instances", self.num_instances, "must be >= 1")
        if self.total_steps is not None and self.total_steps < 1:
            raise _problem("total_steps", self.total_steps, "must be >= 1")
        if not self.engine_slowdown > 0:
            raise _problem("engine_slowdown", self.engine_slowdown, "must be a number > 0")

    def with_(self, **changes: object) -> SimSettings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _problem(key: str, value: object, message: str) -> ConfigError:
    return ConfigError([ConfigProblem((f"sim.{key}",), repr(value), message, "pass a valid value")])
