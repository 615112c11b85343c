"""Prefetcher: a published version pulled in the background is what a sync loads, or nothing is used."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from ps_helpers import ThreadShards, assert_same, small_model

from psrl.ps import Puller, Pusher
from psrl.ps.prefetch import Prefetcher

MakeShards = Callable[..., ThreadShards]
BLOCK = 16 << 10


@pytest.fixture
def parts(make_shards: MakeShards) -> Iterator[tuple[Pusher, Puller]]:
    shards = make_shards(2)
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK, timeout_s=30)
    puller = Puller(shards.pull_endpoints, timeout_s=2)
    yield pusher, puller
    pusher.close()
    puller.close()


def _prefetching_2_of(parts: tuple[Pusher, Puller], versions: list[int]) -> Prefetcher:
    """Publish ``versions`` (model i as version i) and start prefetching version 2."""
    pusher, puller = parts
    for version in versions:
        pusher.push(version, small_model(version))
    prefetcher = Prefetcher(puller)
    assert prefetcher.start(2)
    return prefetcher


def test_a_prefetched_version_is_handed_over_whole(parts: tuple[Pusher, Puller]) -> None:
    pusher, puller = parts
    model = small_model(1)
    pusher.push(1, model)
    prefetcher = Prefetcher(puller)
    assert prefetcher.start(1)
    tensors = prefetcher.take(1)  # waits for the background pull
    assert tensors is not None
    assert_same({name: t.clone() for name, t in tensors}, model)
    assert prefetcher.num_used == 1 and puller.held_version == 1


def test_a_prefetch_of_another_version_is_not_used_and_the_caller_pulls(parts: tuple[Pusher, Puller]) -> None:
    prefetcher = _prefetching_2_of(parts, [1, 2])
    assert prefetcher.take(1) is None  # asked for 1, held 2
    got: dict[str, object] = {}
    parts[1].pull(1, lambda name, t: got.__setitem__(name, t.clone()))
    assert_same(got, small_model(1))  # type: ignore[arg-type]


def test_one_pull_at_a_time_and_never_an_older_version(parts: tuple[Pusher, Puller]) -> None:
    prefetcher = _prefetching_2_of(parts, [1, 2])
    assert not prefetcher.start(2)  # running, or already held
    assert not prefetcher.start(1)  # never goes back to an older version
    assert prefetcher.take(2) is not None
    assert prefetcher.start(1)  # take handed the puller back: a new pull may start
    tensors = prefetcher.take(1)
    assert tensors is not None
    assert_same({name: t.clone() for name, t in tensors}, small_model(1))
    assert prefetcher.num_started == 2


def test_a_failed_prefetch_is_reported_as_nothing_to_use(parts: tuple[Pusher, Puller]) -> None:
    _, puller = parts
    prefetcher = Prefetcher(puller, max_attempts=1)
    assert prefetcher.start(7)  # never published
    assert prefetcher.take(7) is None


def test_delta_pullers_are_refused(make_shards: MakeShards) -> None:
    shards = make_shards(1)
    puller = Puller(shards.pull_endpoints, delta_sync=True, timeout_s=2)
    try:
        with pytest.raises(ValueError, match="full pulls"):
            Prefetcher(puller)
    finally:
        puller.close()


def test_close_waits_for_a_running_pull_and_says_the_puller_is_free(parts: tuple[Pusher, Puller]) -> None:
    prefetcher = _prefetching_2_of(parts, [2])
    assert prefetcher.close()  # the pull finished within the wait
    assert not prefetcher.is_running and prefetcher.take(2) is None  # closed: nothing is handed over
    assert Prefetcher(parts[1]).close()  # nothing running


def test_a_landing_is_for_a_gpu() -> None:
    import torch

    from psrl.ps.landing import DeviceLanding

    with pytest.raises(ValueError, match="CUDA"):
        DeviceLanding(torch.device("cpu"))


@pytest.mark.gpu
def test_a_prefetched_version_lands_on_the_gpu_whole(parts: tuple[Pusher, Puller]) -> None:
    import torch

    from psrl.ps.landing import DeviceLanding

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pusher, puller = parts
    model = small_model(1)
    pusher.push(1, model)
    landing = DeviceLanding(torch.device("cuda"), True)
    prefetcher = Prefetcher(puller, landing=landing)
    assert prefetcher.start(1)
    tensors = prefetcher.take(1)
    assert tensors is not None and all(t.is_cuda for _, t in tensors)
    assert_same({name: t.cpu() for name, t in tensors}, model)
    pusher.push(2, small_model(2))  # the next landing: the puller's mirror is refilled, the landed copy is not
    assert prefetcher.start(2)
    second = prefetcher.take(2)
    assert second is not None and landing.num_landed == 2
    assert_same({name: t.cpu() for name, t in second}, small_model(2))
