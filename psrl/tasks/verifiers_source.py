"""Prime Intellect's verifiers as a task source: `task.name=verifiers:<env>` with `task.kwargs`.

`<env>` is an installed verifiers environment id (loaded by `verifiers.load_environment(env,
**task.kwargs)`, which imports the module named by the id), or a loader of your own,
`package.module:function` or `path/to/file.py:function`, called as `function(**task.kwargs)`; either
returns a `verifiers.Environment` (a `SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, ...).

A verifiers run is an agent run through the session gateway (docs/gateway.md): every dataset row of
the environment becomes an agent row (its `prompt` messages and the environment's tools, so the
gateway renders them with the model's chat template), and each session runs the environment's own
`run_rollout` (its turn loop, `env_response`, stop conditions and tool calls, then its rubric) with an
OpenAI client bound to the session (`psrl.tasks.verifiers_agent`). The rubric's reward is the
session's reward.

Nothing here imports verifiers until a verifiers task is configured; without the extra, the check
before launch names it (`make install-verifiers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psrl.errors import ConfigProblem
from psrl.module_files import ModuleFileError, load_module

PREFIX = "verifiers:"
MODULE = "verifiers"
INSTALL = "make install-verifiers, then run with .venv-verifiers/bin/psrl (or pip install -e '.[verifiers]')"
AGENT_ENTRY = "psrl.tasks.verifiers_agent:rollout"
_LOADED: dict[str, Any] = {}  # one environment per (name, kwargs) in a process: loading may build datasets


class VerifiersLoadError(RuntimeError):
    """The configured environment could not be loaded (the text says why)."""


def is_verifiers(task_name: str) -> bool:
    return task_name.startswith(PREFIX)


def env_reference(task_name: str) -> str:
    return task_name[len(PREFIX) :]


def load_env(task_name: str, kwargs: dict[str, Any]) -> Any:
    """The verifiers environment `task_name` names, built with `kwargs` (cached per process)."""
    key = json.dumps([task_name, kwargs], sort_keys=True, default=str)
    if key not in _LOADED:
        with _own_signal_handlers():
            _LOADED[key] = _load_uncached(env_reference(task_name), kwargs)
    return _LOADED[key]


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """Keep the process's SIGINT and SIGTERM handlers: a verifiers environment installs its own (teardown,
    then exit) when built, which would take the launcher's and the actors' shutdown from them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # off the main thread nothing can install handlers
        return
    kept = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in kept.items():
            signal.signal(number, handler)


def _load_uncached(reference: str, kwargs: dict[str, Any]) -> Any:
    import verifiers

    loader = verifiers.load_environment if ":" not in reference else None  # an env id: its module's loader
    env = loader(reference, **kwargs) if loader is not None else _loader(reference)(**kwargs)
    if not isinstance(env, verifiers.Environment):
        raise VerifiersLoadError(f"{reference} returned {type(env).__name__}, not a verifiers.Environment")
    return env


def _loader(reference: str) -> Any:
    target, _, name = reference.rpartition(":")
    try:
        module = load_module(target, "psrl_verifiers")
    except ModuleFileError as exc:
        raise VerifiersLoadError(str(exc)) from None
    if not hasattr(module, name):
        raise VerifiersLoadError(f"{target} has no function {name!r}")
    return getattr(module, name)


def source_problems(task_name: str, kwargs: dict[str, Any]) -> Iterator[ConfigProblem]:
    """Why `task_name` cannot be trained on: the extra missing, an environment that fails to load, a
    rubric that needs whole groups, an empty dataset."""
    if importlib.util.find_spec(MODULE) is None:
        yield ConfigProblem(("task.name",), repr(task_name), "needs the optional package 'verifiers' "
                            "(the verifiers extra), which is not installed", INSTALL)  # fmt: skip
        return
    try:
        env = load_env(task_name, kwargs)
    except Exception as exc:  # a loader is user code: any failure is a configuration problem
        yield ConfigProblem(("task.name", "task.kwargs"), repr((task_name, kwargs)),
                            f"the verifiers environment does not load ({type(exc).__name__}: {exc})",
                            "give an installed environment id (its module defines load_environment) or "
                            "module:function / file.py:function returning a verifiers.Environment, with "
                            "task.kwargs that its loader accepts")  # fmt: skip
        return
    if env.rubric.has_group_rewards:
        yield ConfigProblem(("task.name",), repr(task_name), "its rubric has group reward functions, which score "
                            "all rollouts of an example together; a psrl session is scored on its own",
                            "use a rubric of per-rollout reward functions")  # fmt: skip
        return
    try:
        size = len(env.get_dataset())
    except ValueError as exc:  # verifiers: 'dataset is not set' (an environment with an eval dataset only)
        yield ConfigProblem(("task.name",), repr(task_name), f"the environment has no training dataset ({exc})",
                            "give the environment a dataset")  # fmt: skip
        return
    if size == 0:
        yield ConfigProblem(("task.kwargs",), repr(kwargs), "the environment's dataset is empty",
                            "give kwargs that make a non-empty dataset")  # fmt: skip
        return
    yield from scoring_problems(task_name, kwargs)


def scoring_problems(task_name: str, kwargs: dict[str, Any]) -> Iterator[ConfigProblem]:
    """The first example's rollout with its reference answer (psrl.tasks.verifiers_probe): a rubric that
    raises or scores with a non-number is refused here rather than failing every session."""
    from psrl.tasks.verifiers_probe import probe

    try:
        probe(export_rows(task_name, kwargs, "psrl", limit=1)[0])
    except Exception as exc:  # the environment and its rubric are user code
        yield ConfigProblem(("task.name",), repr(task_name), f"a rollout of its first example answered with its "
                            f"reference answer fails ({type(exc).__name__}: {exc})",
                            "make every reward function of the rubric return a number for any completion")  # fmt: skip


def plain(value: Any) -> Any:
    """`value` as JSON data: pydantic messages dumped, and the keys an Arrow struct column fills with None
    (e.g. `tool_calls` of a user message) dropped."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def first_call(env: Any, example: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages and tools of the rollout's first model call for `example`, as verifiers' rollout sends
    them: its prompt and tools (the example's `info.tool_defs`, else the environment's) converted by its
    own OpenAI chat client (the gateway matches that call against the row's first turn)."""
    from verifiers.clients import OpenAIChatCompletionsClient
    from verifiers.utils.message_utils import normalize_messages

    client = OpenAIChatCompletionsClient(None)  # only its conversions are used: no connection
    info = example.get("info")
    info = json.loads(info) if isinstance(info, str) else info
    raw_tools = info["tool_defs"] if isinstance(info, dict) and "tool_defs" in info else env.tool_defs
    messages, _ = await client.to_native_prompt(normalize_messages(example["prompt"], field_name="prompt"))
    tools = await client.to_native_tools(env._normalize_tool_defs(raw_tools) or None)
    return plain(messages), plain(tools or [])


def absolute(task_name: str) -> str:
    """`task_name` with a loader file's path made absolute (the env workers may run elsewhere)."""
    target, _, name = env_reference(task_name).rpartition(":")
    if not target.endswith(".py"):
        return task_name
    return f"{PREFIX}{Path(target).resolve()}:{name}"


def export_rows(task_name: str, kwargs: dict[str, Any], model_name: str, limit: int = -1) -> list[dict[str, Any]]:
    """One agent row per example of the environment's training dataset (dataset order; the first `limit`)."""
    task_name = absolute(task_name)
    env = load_env(task_name, kwargs)
    dataset = env.get_dataset(n=limit)
    rows = []
    for position, example in enumerate(dataset):
        messages, tools = asyncio.run(first_call(env, example))
        spec = {"task": task_name, "kwargs": kwargs, "example": position, "model": model_name}
        row = {"messages": messages, "tools": tools, "answer": str(example.get("answer", "")), "kind": "verifiers"}
        rows.append({**row, "verifiers": spec})
    return rows


def rows_file(task_name: str, kwargs: dict[str, Any], model_name: str) -> Path:
    """The agent dataset of a verifiers task, written once under the cache directory (named by its
    content, so a run and its replay read the same rows)."""
    rows = export_rows(task_name, kwargs, model_name)
    text = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in rows)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    root = Path(os.environ.get("PSRL_CACHE_DIR") or Path.home() / ".cache" / "psrl") / "verifiers"
    path = root / f"{digest}.jsonl"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)  # atomic: a concurrent launch never reads half a file
    return path


def agent_overrides(task_name: str, kwargs: dict[str, Any], model_name: str) -> list[str]:
    """The config overrides that run a verifiers task as agent sessions through the gateway."""
    path = rows_file(task_name, kwargs, model_name)
    return [f"agent.entry={AGENT_ENTRY}", f"agent.dataset={path}", "env.enable=true"]
