"""The router's view of the instances' offload tiers: incremental reports, version-aware matches."""

from __future__ import annotations

from psrl.kvcache.keys import prefix_hashes
from psrl.routing.tier_directory import TierDirectory

TOKENS = list(range(1, 42))  # 10 whole blocks of 4; 10 reusable (the last token is recomputed)


def test_matches_count_leading_blocks_of_the_instance_version_only() -> None:
    versions = {"a": 2, "b": 3}
    directory = TierDirectory(4, versions.get)
    hashes = prefix_hashes(TOKENS, 4)
    directory.apply("a", "tcp://a", [(2, h) for h in hashes[:6]], [], False, 1)
    directory.apply("b", "tcp://b", [(2, h) for h in hashes], [], False, 1)  # b runs version 3
    assert directory.match(TOKENS) == {"a": 24}
    directory.apply("a", "", [], [(2, hashes[2])], False, 2)  # a gap ends the prefix
    assert directory.match(TOKENS) == {"a": 8}
    assert directory.addresses == {"a": "tcp://a", "b": "tcp://b"}


def test_clear_and_gaps() -> None:
    directory = TierDirectory(4, lambda _: 0)
    hashes = prefix_hashes(TOKENS, 4)
    directory.apply("a", "tcp://a", [(0, h) for h in hashes], [], False, 1)
    directory.apply("a", "", [(0, hashes[0])], [], True, 2)
    assert directory.match(TOKENS) == {"a": 4}
    directory.apply("a", "", [(0, h) for h in hashes[1:]], [], False, 3)
    assert directory.num_gaps == 0 and directory.match(TOKENS) == {"a": 40}
    # report 4 is lost: what it removed must not be scored; the instance's keys are forgotten
    directory.apply("a", "", [(0, hashes[0])], [], False, 5)
    assert directory.num_gaps == 1 and directory.blocks("a") == {(0, hashes[0])}
    assert directory.match(TOKENS) == {"a": 4}
    directory.remove("a")
    assert directory.match(TOKENS) == {} and not directory.addresses
