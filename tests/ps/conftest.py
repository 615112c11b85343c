"""Fixtures of the PS tests: short socket directories and shard servers in threads."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest
from ps_helpers import ThreadShards


@pytest.fixture
def sockdir() -> Iterator[str]:
    # ipc paths must stay short (about 100 bytes), so not under pytest's long tmp_path.
    path = tempfile.mkdtemp(prefix="ps", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_shards(sockdir: str) -> Iterator[Callable[..., ThreadShards]]:
    made: list[ThreadShards] = []

    def make(num_shards: int = 2, transport: str = "zmq", serve_dtype: str | None = None) -> ThreadShards:
        shards = ThreadShards(sockdir, num_shards, transport, serve_dtype)
        made.append(shards)
        return shards

    yield make
    for shards in made:
        shards.stop()
