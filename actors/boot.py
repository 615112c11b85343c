"""What an actor process is told when it starts: its identity, the config, where the bus is.

The launcher writes one JSON line (`Boot.to_json`) to the actor's stdin, locally or through
ssh, so a remote actor needs no shared filesystem: the resolved config, the bus endpoints,
the endpoint directory of request sockets and (across hosts) the CURVE key files all travel
in the boot line. After the boot line the launcher keeps stdin open; end-of-file means the
launcher is gone and the actor shuts itself down (no orphans on any host).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bus.addresses import BusAddresses
from bus.security import CurveKeys, load_keys

# ActorStatus detail of a trainer saving its version while it stops: the launcher then gives its
# stage up to trainer.stop_save_timeout_s instead of the usual grace
CHECKPOINT_ON_STOP = "checkpoint on stop"


@dataclass(frozen=True)
class Boot:
    name: str
    role: str
    index: int
    incarnation: int
    config_yaml: str
    bus: dict[str, Any]
    endpoints: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    run_dir: str | None = None
    curve_files: dict[str, str] = field(default_factory=dict)
    exit_on_stdin_eof: bool = True
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Boot:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("boot line is not a JSON object")
        return cls(**data)

    @classmethod
    def read(cls, stream: TextIO = sys.stdin) -> Boot:
        line = stream.readline()
        if not line:
            raise ValueError("no boot line on stdin (actors are started by `psrl launch`)")
        return cls.from_json(line)

    def addresses(self) -> BusAddresses:
        data = dict(self.bus)
        data["curve_dir"] = None
        return BusAddresses(**data)

    def endpoint(self, name: str) -> str:
        try:
            return self.endpoints[name]
        except KeyError:
            raise KeyError(f"{self.name}: no endpoint for {name!r} (known: {sorted(self.endpoints)})") from None

    def curve_keys(self) -> CurveKeys | None:
        """Load the boot line's keys (None = no CURVE).

        zmq reads keys from files only, so they pass through a private directory that is removed
        as soon as they are in memory: secret keys are not left behind in the temp directory.
        """
        if not self.curve_files:
            return None
        directory = Path(tempfile.mkdtemp(prefix=f"psrl-keys-{self.name}-"))
        try:
            for relative, content in self.curve_files.items():
                path = directory / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
                os.chmod(path, 0o600)
            return load_keys(directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def read_curve_files(directory: str | Path) -> dict[str, str]:
    """Every key file under ``directory`` (relative path -> content), for a boot line."""
    root = Path(directory)
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}
