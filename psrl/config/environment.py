"""Checks of a configuration against this machine's installed packages, before a run starts actors.

They are not part of `load_config`: a recorded run's config.yaml must load anywhere (replay,
report, the simulator), whatever is installed there. `psrl launch`, `psrl config show` and the
benchmark tools run them before anything starts.
"""

from __future__ import annotations

from psrl.config.root import Config
from psrl.errors import ConfigError, ConfigProblem


def environment_problems(config: Config) -> list[ConfigProblem]:
    if config.engine.backend != "vllm":
        return []
    from psrl.engine.vllm_backend.availability import vllm_unavailable

    missing = vllm_unavailable()
    if missing is not None:
        return [ConfigProblem(("engine.backend",), repr("vllm"), *missing)]
    from psrl.engine.vllm_backend.validation import vllm_problems

    return vllm_problems(config)


def check_environment(config: Config) -> None:
    """Raise ConfigError listing every problem (the vLLM extra, and vLLM's verdict on its arguments)."""
    problems = environment_problems(config)
    if problems:
        raise ConfigError(problems)
