"""Shared fixtures. Tests use real parts; fakes live only in tests/fakes at the outer edges."""

import ctypes
import os

import pytest

# One torch thread per test process: the suite runs on 2 shared cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def cpu_kernels() -> ctypes.CDLL:
    """The compiled CPU kernel library; tests of the fused paths skip, naming why, where it cannot be built."""
    from psrl.kernels.build import KernelBuildError
    from psrl.kernels.library import cpu_kernel_library

    try:
        return cpu_kernel_library()
    except KernelBuildError as error:
        pytest.skip(f"the CPU kernels cannot be built here: {error}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Multi-process system tests first (the rest keep their order): each runs a minute or more, and
    started first they overlap the short tests on the other worker instead of ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("system") is None)
