"""How a KV fetch cuts its keys into pieces: short first (the leading blocks land early), then
doubling up to a cap (few pieces for a long fetch), every key once, in prefix order."""

from __future__ import annotations

import pytest

from psrl.kvcache.transfer.client import growing_pieces


def keys_of(count: int) -> list[tuple[int, int]]:
    return [(1, index) for index in range(count)]


@pytest.mark.parametrize(
    ("count", "first", "largest", "sizes"),
    [
        (0, 16, 64, [0]),  # a fetch of nothing still asks once (a fetcher warming its connection)
        (10, 16, 64, [10]),
        (64, 16, 64, [16, 32, 16]),
        (256, 16, 64, [16, 32, 64, 64, 64, 16]),
        (13, 2, 2, [2, 2, 2, 2, 2, 2, 1]),  # no growth when the cap is the first size
        (13, 2, 5, [2, 4, 5, 2]),
    ],
)
def test_pieces_double_up_to_the_cap_and_cover_every_key_in_order(
    count: int, first: int, largest: int, sizes: list[int]
) -> None:
    pieces = growing_pieces(keys_of(count), first, largest)
    assert [len(piece) for piece in pieces] == sizes
    assert [key for piece in pieces for key in piece] == keys_of(count)
