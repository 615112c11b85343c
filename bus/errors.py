"""Errors raised by the bus. Decoding problems are data (counted and dropped), never crashes."""

from __future__ import annotations

from enum import Enum


class BusError(Exception):
    """A bus operation failed (bad address, bad keys, closed socket, ...)."""


class DropReason(str, Enum):
    """Why a received message was dropped; the receiver counts drops per reason."""

    MALFORMED = "malformed"
    UNKNOWN_KIND = "unknown_kind"
    OVERSIZED = "oversized"
    UNSUPPORTED_VERSION = "unsupported_version"


class DecodeError(BusError):
    """One received message cannot be decoded; it is dropped and counted under `reason`."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
