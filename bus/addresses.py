"""The run's bus endpoints, saved as ``<run_dir>/bus.json`` for actors and ``psrl tap``.

Two XSUB/XPUB proxy pairs carry a run's events: ``events`` for data and status, ``control`` for
pause, resume, drain, shutdown, sync, migrate and abort, so control is never queued behind data.
Publishers connect to the ``*_in`` side, subscribers to the ``*_out`` side.

`plan_addresses` chooses addresses before the proxy binds: ``ipc://`` sockets under the run
directory (or under a short directory in the temp dir when the run path is too long for a Unix
socket path), or ``tcp://HOST:*``, whose ports the proxy resolves when binding. The bound,
concrete addresses are what gets saved.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

from bus.errors import BusError

BUS_FILE = "bus.json"
_MAX_IPC_PATH = 100  # Unix socket paths are limited to 107 bytes on Linux


@dataclass(frozen=True)
class BusAddresses:
    events_in: str
    events_out: str
    control_in: str
    control_out: str
    curve_dir: str | None = None
    catch_up: str | None = None  # the proxy's retainer (bus/retainer.py): a restarted logger's catch-up

    def save(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / BUS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> BusAddresses:
        path = Path(run_dir) / BUS_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise BusError(f"{path} does not exist: is {run_dir} a run directory whose bus is up?") from exc
        except (OSError, json.JSONDecodeError) as exc:
            raise BusError(f"{path} is not readable JSON: {exc}") from exc
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or not {"events_in", "events_out", "control_in", "control_out"} <= set(data):
            raise BusError(f"{path} lacks bus addresses (events_in, events_out, control_in, control_out)")
        return cls(**{k: v for k, v in data.items() if k in names})


def ipc_dir(run_dir: str | Path) -> Path:
    """Where the run's ipc sockets live: ``<run_dir>/bus``, or a short stand-in for long paths."""
    preferred = Path(run_dir).resolve() / "bus"
    if len(str(preferred)) + len("/control_out.sock") <= _MAX_IPC_PATH:
        return preferred
    digest = hashlib.sha1(str(preferred).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"psrl-{digest}"


def plan_addresses(
    run_dir: str | Path,
    transport: Literal["ipc", "tcp"] = "ipc",
    host: str = "127.0.0.1",
    curve_dir: str | None = None,
) -> BusAddresses:
    """Addresses for the proxy to bind (tcp ports are chosen at bind time)."""
    if transport == "ipc":
        directory = ipc_dir(run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        names = {name: f"ipc://{directory}/{name}.sock" for name in (*_ENDPOINTS, "catch_up")}
    elif transport == "tcp":
        names = {name: f"tcp://{host}:*" for name in (*_ENDPOINTS, "catch_up")}
    else:
        raise BusError(f"unknown bus transport {transport!r}; use ipc or tcp")
    return BusAddresses(**names, curve_dir=curve_dir)


def inproc_addresses(prefix: str) -> BusAddresses:
    """Addresses for a bus inside one process (tests, embedded use)."""
    return BusAddresses(**{name: f"inproc://{prefix}-{name}" for name in _ENDPOINTS})


_ENDPOINTS = ("events_in", "events_out", "control_in", "control_out")
