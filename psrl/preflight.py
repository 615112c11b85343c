"""Checks that need no actor, run by `psrl config show`, `psrl launch` and `psrl.run` before anything starts.

The config rules (psrl.config.rules) check values against each other; these check them against
the machine: the model directory and its architecture, the dataset files and their columns, the
reward function and its signature, the optional packages the chosen features need, and the GPUs
GPU settings ask for. Relative paths are made absolute first, so every actor (whatever its working
directory) reads the same files.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from psrl.config import Config
from psrl.config.loader import relative_to_file
from psrl.config.rules import problem
from psrl.cpu_usage import nvidia_gpu_present
from psrl.errors import ConfigError, ConfigProblem

ROWS_CHECKED = 64  # rows of each split rendered before the run starts
Check = Callable[[Config, dict[str, Any]], Iterator[ConfigProblem]]


def absolute_paths(config: Config) -> Config:
    """A copy of `config` with model, tokenizer, data and reward-file paths made absolute (from the
    working directory; paths in a config file were already made relative to that file)."""
    tree = config.model_dump(mode="json")
    relative_to_file(tree, Path.cwd())
    return Config.model_validate(tree)


def check_environment(config: Config, *, spans_hosts: bool = False) -> list[ConfigProblem]:
    """Every problem found (empty when the run can start). Across hosts the GPUs are not this machine's."""
    found: dict[str, Any] = {}  # what one check learns (tokenizer, dataset columns) and a later one needs
    checks = [c for c in CHECKS if not (spans_hosts and c in (gpus, memory_saver_device))]
    return [*(p for check in checks for p in check(config, found)), *cpu_placement_host(config, spans_hosts)]


def cpu_placement_host(c: Config, spans_hosts: bool) -> Iterator[ConfigProblem]:
    """``topology.cpu_placement=on`` needs every actor on this host and a CPU-only host (the rest of
    what it needs is in the configuration: psrl.config.rules.cpu_placement_possible)."""
    if c.topology.cpu_placement != "on":
        return
    if spans_hosts:
        yield problem("topology.cpu_placement", "on", "the run spans hosts: the launcher pins only its own",
                      "set topology.cpu_placement=auto or off")  # fmt: skip
    elif c.topology.device == "auto" and nvidia_gpu_present():
        yield problem(("topology.cpu_placement", "topology.device"), "on", "this host has a GPU, which device=auto "
                      "uses: the trainer's CPU cores are not its step", "set topology.device=cpu, or "
                      "topology.cpu_placement=auto or off")  # fmt: skip


def checked(config: Config, *, spans_hosts: bool = False) -> Config:
    """`config` with absolute paths and the weight transport chosen (``psrl.ps.transport=auto``), or
    ConfigError listing every problem."""
    from psrl.ps.from_config import resolve_transport

    config = absolute_paths(config)
    problems = check_environment(config, spans_hosts=spans_hosts)
    if problems:
        raise ConfigError(problems)
    config, _ = resolve_transport(config, spans_hosts=spans_hosts)
    from psrl.tasks.verifiers_source import AGENT_ENTRY, agent_overrides, is_verifiers

    if is_verifiers(config.task.name) and config.agent.entry != AGENT_ENTRY:  # run as agent sessions (the gateway)
        from psrl.config import load_config

        overrides = agent_overrides(config.task.name, config.task.kwargs, config.agent.gateway.model_name)
        return checked(load_config(None, overrides, base=config), spans_hosts=spans_hosts)
    return config


def _renders_prompts(c: Config) -> bool:
    """Whether a later check renders prompts with the model's tokenizer (a dataset, a reasoning-gym task)."""
    from psrl.tasks.reasoning_gym import is_reasoning_gym

    return bool(c.data.train_files or c.data.val_files) or is_reasoning_gym(c.task.name)


def model_directory(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    from psrl.assets import DEMO_MODEL_DIR
    from psrl.errors import FatalError
    from psrl.models.spec import ModelSpec

    path = c.model.path or str(DEMO_MODEL_DIR)
    if not Path(path).is_dir():
        yield problem("model.path", path, "no such directory", "give a Hugging Face checkpoint directory")
        return
    try:
        ModelSpec.from_dir(path)
    except FatalError as exc:
        yield problem("model.path", path, str(exc), "use a checkpoint of a supported architecture")
    tokenizer_dir = c.model.tokenizer_path or path
    try:
        if _renders_prompts(c) or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            found["tokenizer"] = AutoTokenizer.from_pretrained(tokenizer_dir)
        else:  # nothing to render here: the fast tokenizer's file is checked without importing transformers
            from tokenizers import Tokenizer

            Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a directory it cannot read
        field_path = "model.tokenizer_path" if c.model.tokenizer_path else "model.path"
        yield problem(field_path, tokenizer_dir, f"no loadable tokenizer ({type(exc).__name__}: {exc})",
                      "point model.tokenizer_path at a directory with tokenizer files")  # fmt: skip


def prompts(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    from psrl.data import DataError, load_split
    from psrl.envs.catalog import all_task_names, is_task_name
    from psrl.tasks.reasoning_gym import is_reasoning_gym
    from psrl.tasks.verifiers_source import is_verifiers

    if c.trainer.eval_interval and c.data.train_files and not c.data.val_files:
        yield problem(("trainer.eval_interval", "data.val_files"), c.trainer.eval_interval,
                      "evaluation needs a held-out split", "set data.val_files or trainer.eval_interval=0")  # fmt: skip
    if not c.data.train_files:
        if c.data.val_files:
            yield problem(("data.val_files", "data.train_files"), c.data.val_files,
                          "a validation split needs a training dataset", "set data.train_files too")  # fmt: skip
        elif is_reasoning_gym(c.task.name):
            yield from reasoning_gym_source(c, found)
        elif is_verifiers(c.task.name):
            yield from verifiers_source(c)
        elif not is_task_name(c.task.name):
            yield problem("task.name", c.task.name, "unknown task",
                          f"use one of {all_task_names()}, or give a dataset with data.train_files")  # fmt: skip
        return
    if "tokenizer" not in found:
        return  # the model check has reported why
    for split in ("train", "val"):
        path = f"data.{split}_files"
        try:
            dataset = load_split(c.data, split, found["tokenizer"], c.task.max_prompt_length)
            if dataset is not None:
                for index in range(min(ROWS_CHECKED, len(dataset))):
                    dataset.render(dict(dataset.table[index]))
        except DataError as exc:
            yield problem(path, getattr(c.data, f"{split}_files"), str(exc), "fix the file or the data.* keys")
            continue
        if dataset is not None:
            found[f"{split}_columns"] = list(dataset.table.column_names)


def environment_task(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    """Multi-turn sessions run the environment named by task.name (an agent brings its own loop)."""
    from psrl.envs import env_names, is_env_name

    if c.env.enable and not c.agent.enabled and not is_env_name(c.task.name):
        yield problem(("env.enable", "task.name"), c.task.name, "multi-turn sessions need an environment task",
                      f"set task.name to one of {env_names()} or package.module:factory")  # fmt: skip


def reasoning_gym_source(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    """The extra, the dataset name and its kwargs; then the first prompts rendered must fit task.max_prompt_length."""
    from psrl.tasks.reasoning_gym import ReasoningGymTask, source_problems

    problems = list(source_problems(c.task.name, c.task.kwargs))
    yield from problems
    if problems or "tokenizer" not in found:
        return
    task = ReasoningGymTask.from_config(c, found["tokenizer"])
    longest = max(len(t.prompt(i).token_ids) for t in (task, task.held_out()) for i in range(ROWS_CHECKED // 8))
    if longest > c.task.max_prompt_length:
        yield problem("task.max_prompt_length", c.task.max_prompt_length,
                      f"{c.task.name} renders prompts of {longest} tokens",
                      f"set task.max_prompt_length={longest * 2} or more")  # fmt: skip


def verifiers_source(c: Config) -> Iterator[ConfigProblem]:
    """The extra and the environment (it loads, its rubric scores one rollout at a time, it has data); a
    verifiers task runs its own agent."""
    from psrl.tasks.verifiers_source import AGENT_ENTRY, source_problems

    if c.agent.enabled and c.agent.entry != AGENT_ENTRY:
        yield problem(("agent.entry", "agent.command", "task.name"), c.agent.entry or c.agent.command,
                      "a verifiers task runs the environment's own rollouts as its agent",
                      "remove agent.entry and agent.command")  # fmt: skip
    yield from source_problems(c.task.name, c.task.kwargs)


def reward_function(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    from psrl.rewards.loader import RewardLoadError, load_reward_function

    if c.reward.function is None:
        if c.data.train_files:
            yield problem(("reward.function", "data.train_files"), None, "a dataset has no reward of its own",
                          "set reward.function=path/to/file.py:fn (or psrl.rewards.builtin:math_answer)")  # fmt: skip
        return
    try:
        load_reward_function(c.reward.function, found.get("train_columns", []), c.reward.kwargs)
    except RewardLoadError as exc:
        yield problem("reward.function", c.reward.function, str(exc), "see `reward.function` in docs/configuration.md")


# feature switch -> (config path, is it on, module, extra)
def _extras(c: Config) -> list[tuple[str, bool, str, str]]:
    return [
        ("psrl.ps.transport", c.psrl.ps.transport == "nixl", "nixl", "kv"),
        ("psrl.lmcache.enable", c.psrl.lmcache.enable, "lmcache", "kv"),
        ("psrl.tms.range", c.psrl.tms.range is not None, "torch_memory_saver", "gpu"),
        ("logging.wandb.enable", c.logging.wandb.enable, "wandb", "wandb"),
        ("agent.entry", c.agent.enabled, "fastapi", "agents"),  # the session gateway's server
        ("agent.entry", c.agent.enabled, "uvicorn", "agents"),
        ("agent.entry", c.agent.entry != "", "openai", "agents"),  # the client a callable agent is given
    ]


def optional_packages(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    for path, is_on, module, extra in _extras(c):
        if is_on and importlib.util.find_spec(module) is None:
            yield problem(path, getattr_path(c, path), f"needs the optional package '{module}', which is not installed",
                          f"pip install 'psrl[{extra}]' (or turn the feature off)")  # fmt: skip


def vllm_backend(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    """The vllm extra (with the install commands when it is missing), then vLLM's verdict on engine.vllm_args."""
    if c.engine.backend != "vllm":
        return
    from psrl.engine.vllm_backend.availability import vllm_unavailable

    missing = vllm_unavailable()
    if missing is not None:
        yield ConfigProblem(("engine.backend",), repr("vllm"), *missing)
        return
    from psrl.engine.vllm_backend.validation import vllm_problems

    yield from vllm_problems(c)


def gpus(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    topo = c.topology
    listed = [*topo.trainer_gpus, *topo.rollout_gpus]
    if topo.device != "cuda" and not listed:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        settings = (("topology.device", topo.device == "cuda"), ("topology.trainer_gpus", topo.trainer_gpus),
                    ("topology.rollout_gpus", topo.rollout_gpus))  # fmt: skip
        paths = [path for path, used in settings if used]
        yield problem(tuple(paths), topo.device, "no CUDA device is visible on this machine",
                      "set topology.device=cpu (or auto) and leave the GPU lists empty")  # fmt: skip
        return
    for name, indices in (("trainer_gpus", topo.trainer_gpus), ("rollout_gpus", topo.rollout_gpus)):
        beyond = [i for i in indices if i >= count]
        if beyond:
            yield problem(f"topology.{name}", indices, f"GPUs {beyond} do not exist ({count} visible)",
                          f"use indices 0..{count - 1}")  # fmt: skip


def offload_memory(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    """The offload tiers (psrl.lmcache.offload_size_gb, split over the instances) are allocated up front."""
    lm = c.psrl.lmcache
    if not lm.enable or c.engine.backend != "embedded":
        return
    available = _available_memory_gb()
    if available is not None and lm.offload_size_gb > available:
        yield problem("psrl.lmcache.offload_size_gb", lm.offload_size_gb,
                      f"the offload tiers need more memory than this machine has available ({available:.1f} GiB)",
                      f"set psrl.lmcache.offload_size_gb to at most {0.5 * available:.1f}")  # fmt: skip


def _available_memory_gb() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024**2
    except OSError:
        return None
    return None


def memory_saver_device(c: Config, found: dict[str, Any]) -> Iterator[ConfigProblem]:
    """torch-memory-saver drives libcuda directly: any psrl.tms.range needs a CUDA device on this machine."""
    if c.psrl.tms.range is None:
        return
    import torch

    if not torch.cuda.is_available():
        yield problem("psrl.tms.range", c.psrl.tms.range, "torch-memory-saver releases GPU memory through libcuda, "
                      "and no CUDA device is visible on this machine",
                      "set psrl.tms.range=null and topology.colocate=False, or run on a CUDA machine")  # fmt: skip


def getattr_path(config: Config, path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


CHECKS: tuple[Check, ...] = (
    model_directory, prompts, environment_task, reward_function, optional_packages, offload_memory, vllm_backend, gpus,
    memory_saver_device,
)  # fmt: skip
