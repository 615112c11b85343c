"""Compile the C kernels once per machine and load them with ctypes.

The shared library is built with the system C compiler (`$CC`, else `cc`) for the host CPU
(-march=native) and cached under `$PSRL_CACHE_DIR/kernels` (default `~/.cache/psrl/kernels`), keyed
by the source, the flags, the compiler and the CPU's feature flags, so a cache shared between
different machines never hands one of them code for another's instruction set. The build is
written to a temporary directory and renamed into place, so processes that build at the same time
do not see each other's half-written files. Building takes well under a second.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

# fast math: vectorised exp (glibc's libmvec) and reductions
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")
# linked without -ffast-math: with it, gcc adds crtfastmath.o, whose constructor would switch the
# whole process to flushing denormals the moment the library is loaded
LINK = ("-shared", "-fopenmp")
LIBS = ("-lm",)


class KernelBuildError(RuntimeError):
    """The kernels could not be compiled or loaded on this machine."""


def cache_dir() -> Path:
    root = os.environ.get("PSRL_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "psrl") / "kernels"


def compiler() -> str:
    name = os.environ.get("CC", "cc")
    path = shutil.which(name)
    if path is None:
        raise KernelBuildError(f"no C compiler found (looked for {name!r}; set CC or install gcc)")
    return path


def load_library(name: str, sources: list[Path]) -> ctypes.CDLL:
    """The library built from `sources`, compiled first if this machine has no cached build of them."""
    cc = compiler()
    target = cache_dir() / f"{name}-{_build_key(sources, cc)}.so"
    if not target.exists():
        try:
            _compile(cc, sources, target)
        except OSError as error:  # the cache directory cannot be created or written
            raise KernelBuildError(
                f"cannot build into {target.parent}: {error} (set PSRL_CACHE_DIR to a writable directory)"
            ) from error
    try:
        return ctypes.CDLL(str(target))
    except OSError as error:
        raise KernelBuildError(f"cannot load {target}: {error}") from error


def _compile(cc: str, sources: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        objects = [os.path.join(scratch, f"{index}-{source.stem}.o") for index, source in enumerate(sources)]
        for source, obj in zip(sources, objects, strict=True):
            _run([cc, *FLAGS, "-c", str(source), "-o", obj])
        library = os.path.join(scratch, target.name)
        _run([cc, *LINK, "-o", library, *objects, *LIBS])
        os.replace(library, target)  # atomic: a concurrent build of the same key writes the same bytes
    log.info("kernels_built", library=str(target))


def _run(command: list[str]) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise KernelBuildError(f"{' '.join(command)} failed: {error}") from error
    if result.returncode != 0:
        raise KernelBuildError(f"{' '.join(command)} failed:\n{result.stderr.strip()}")


def _build_key(sources: list[Path], cc: str) -> str:
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.read_bytes())
    digest.update(repr((FLAGS, LINK, LIBS)).encode())
    digest.update(_compiler_version(cc).encode())
    digest.update(platform.machine().encode())
    digest.update(_cpu_flags().encode())
    return digest.hexdigest()[:16]


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise KernelBuildError(f"cannot run the C compiler {cc}: {error}") from error


def _cpu_flags() -> str:
    """The CPU's feature flags (what -march=native compiles for); empty where /proc/cpuinfo is absent."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return line
    return ""
