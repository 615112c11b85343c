"""Error taxonomy shared by every component.

Two levels, so a long-lived actor knows what to do with a failure:

* `RequestError` (recoverable): one request, session or message failed; the actor reports it
  scoped to that request and keeps serving others.
* `FatalError` (unrecoverable): the actor cannot continue; it publishes `ActorDead` and exits.

`ConfigError` carries every configuration problem found at once, each naming the field path,
the offending value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass


class PsrlError(Exception):
    """Base class of all psrl errors."""


class RequestError(PsrlError):
    """A single request failed; the component that raised it keeps serving."""

    def __init__(self, request_id: str | int | None, reason: str) -> None:
        super().__init__(f"request {request_id}: {reason}")
        self.request_id = request_id
        self.reason = reason


class FatalError(PsrlError):
    """The actor cannot continue."""


class MissingExtraError(PsrlError):
    """A configured feature needs an optional dependency that is not installed."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the optional package '{module}', which is not installed. "
            f"Install it with: pip install -e '.[{extra}]' (or turn the feature off)."
        )
        self.feature = feature
        self.extra = extra
        self.module = module


@dataclass(frozen=True)
class ConfigProblem:
    """One configuration problem: where, what value, and how to fix it."""

    paths: tuple[str, ...]
    value: str
    message: str
    fix: str

    def render(self) -> str:
        where = " + ".join(self.paths)
        return f"{where} = {self.value}: {self.message}\n    fix: {self.fix}"


class ConfigError(PsrlError):
    """Invalid configuration; lists every problem found, not just the first."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        count = len(problems)
        header = f"invalid configuration ({count} problem{'s' if count != 1 else ''}):"
        body = "\n".join(f"  - {p.render()}" for p in problems)
        super().__init__(f"{header}\n{body}")
