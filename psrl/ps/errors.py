"""Recoverable PS failures: a push or a pull failed; the caller retries, the process keeps serving."""

from __future__ import annotations

from psrl.errors import RequestError


class PushRefusedError(RequestError):
    """A shard refused the push for good (stale incarnation, version not newer): retrying cannot help."""

    def __init__(self, version: int, reason: str, latest_version: int, max_incarnation: int) -> None:
        super().__init__(f"push v{version}", reason)
        self.version = version
        self.latest_version = latest_version
        self.max_incarnation = max_incarnation


class PushFailedError(RequestError):
    """The push did not complete in time (a shard stayed down, or kept failing); nothing was published."""

    def __init__(self, version: int, reason: str) -> None:
        super().__init__(f"push v{version}", reason)
        self.version = version


class PullFailedError(RequestError):
    """A pull failed (version retired or not committed, digest mismatch, checksum, timeout).

    The instance's weights may hold entries of the failed version: it must pull again before serving.
    ``latest`` is the newest committed version a shard reported (-1 if unknown), the usual retry target.
    """

    def __init__(self, version: int, reason: str, latest: int = -1) -> None:
        super().__init__(f"pull v{version}", reason)
        self.version = version
        self.latest = latest
