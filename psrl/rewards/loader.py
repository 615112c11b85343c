"""Load a reward function named in the config and call it with the arguments it asks for.

`reward.function` is ``path/to/file.py:name`` (the file is imported on its own, its directory put
on sys.path so it can import its neighbours) or ``package.module:name``. The function declares
the arguments it wants, by name, from:

    prompt        the prompt text the policy saw (chat template applied)
    response      the decoded response (special tokens removed)
    prompt_ids    the prompt's token ids (list of int)
    response_ids  the response's token ids (list of int)
    answer        the row's reference answer (data.answer_key), "" when it has none
    row           the whole dataset row (dict)
    <column>      any column of the dataset row, by its name
    <key>         any entry of reward.kwargs

and returns a float, or a dict of floats with a ``score`` (and optionally ``acc``; every other
entry becomes a ``reward/<key>`` metric). It may be ``async def``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psrl.config.data import reward_file
from psrl.errors import PsrlError

ARGUMENTS = ("prompt", "response", "prompt_ids", "response_ids", "answer", "row")


class RewardLoadError(PsrlError):
    """The reward function cannot be found, imported, or called with the arguments psrl has."""


@dataclass(frozen=True)
class RewardFunction:
    spec: str
    fn: Callable[..., Any]
    is_async: bool
    parameters: tuple[str, ...]  # named parameters it accepts
    takes_any_keyword: bool  # it has **kwargs: every argument is passed

    def select(self, available: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to pass, out of everything available."""
        if self.takes_any_keyword:
            return available
        return {name: available[name] for name in self.parameters if name in available}


def load_reward_function(spec: str, columns: Collection[str] = (), kwargs: Collection[str] = ()) -> RewardFunction:
    """Import `spec` and check that every argument it requires is one psrl can give.

    `columns`: the dataset's columns (None-free); `kwargs`: the keys of reward.kwargs."""
    target, name = _split(spec)
    module = _import_file(target) if reward_file(spec) else _import_module(target)
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardLoadError(f"{spec}: {target} has no {name!r} (callables there: {public[:10]})")
    if not callable(fn):
        raise RewardLoadError(f"{spec}: {name!r} is a {type(fn).__name__}, not a function")
    return _describe(spec, fn, {*ARGUMENTS, *columns, *kwargs})


def _split(spec: str) -> tuple[str, str]:
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise RewardLoadError(f"{spec!r}: write it as path/to/file.py:function or package.module:function")
    return target, name


def _import_file(target: str) -> Any:
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise RewardLoadError(f"{target}: no such file")
    module_name = f"psrl_reward_{path.stem}_{abs(hash(str(path)))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardLoadError(f"{target}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the file may import modules next to it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardLoadError(f"{target}: importing it raised {type(exc).__name__}: {exc}") from exc
    sys.modules[module_name] = module
    return module


def _import_module(target: str) -> Any:
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise RewardLoadError(f"{target}: cannot import it ({type(exc).__name__}: {exc})") from exc


def _describe(spec: str, fn: Callable[..., Any], available: set[str]) -> RewardFunction:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise RewardLoadError(f"{spec}: its signature cannot be read ({exc})") from exc
    named: list[str] = []
    takes_any = False
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            takes_any = True
        elif parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise RewardLoadError(f"{spec}: argument {parameter.name!r} is positional-only; psrl passes keywords")
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            named.append(parameter.name)
            if parameter.default is inspect.Parameter.empty and parameter.name not in available:
                raise RewardLoadError(
                    f"{spec}: required argument {parameter.name!r} is none of {sorted(available)}; "
                    "rename it, give it a default, or add it to reward.kwargs"
                )
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
    return RewardFunction(spec, fn, is_async, tuple(named), takes_any)
