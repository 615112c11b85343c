"""Whether a process id names a live process on this machine."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists, also when it belongs to another user (we may not signal it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
