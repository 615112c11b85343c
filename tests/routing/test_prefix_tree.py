"""The shared token radix tree: per-instance prefix matches, accounting and LRU eviction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from psrl.routing.prefix_tree import PrefixTree


def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_match_reports_each_instances_longest_prefix() -> None:
    tree = PrefixTree()
    tree.insert((1, 2, 3, 4), "a", 1)
    tree.insert((1, 2, 9), "b", 2)
    tree.insert((7, 7), "c", 3)
    assert tree.match((1, 2, 3, 5)) == {"a": 3, "b": 2}
    assert tree.match((1, 2, 9, 9, 9)) == {"a": 2, "b": 3}
    assert tree.match((8,)) == {}
    assert tree.match(()) == {}


def test_tokens_are_counted_once_per_instance_and_shared_prefixes_once_in_the_tree() -> None:
    tree = PrefixTree()
    tree.insert((1, 2, 3, 4), "a", 1)
    tree.insert((1, 2, 3, 4), "a", 2)  # same prefix again: nothing new
    tree.insert((1, 2, 5), "a", 3)  # splits the edge; adds one token
    tree.insert((1, 2, 3), "b", 4)
    assert tree.tenant_tokens("a") == 5
    assert tree.tenant_tokens("b") == 3
    assert tree.tokens_by_tenant == {"a": 5, "b": 3}


def test_remove_tenant_forgets_only_that_instance() -> None:
    tree = PrefixTree()
    tree.insert((1, 2, 3), "a", 1)
    tree.insert((1, 2, 3, 4), "b", 2)
    tree.remove_tenant("b")
    assert tree.match((1, 2, 3, 4)) == {"a": 3}
    assert tree.tenant_tokens("b") == 0
    tree.remove_tenant("missing")  # no error


def test_eviction_drops_least_recently_used_prefixes_first() -> None:
    tree = PrefixTree()
    tree.insert((1, 1, 1, 1), "a", 1)  # oldest
    tree.insert((2, 2, 2, 2), "a", 2)
    tree.insert((3, 3, 3, 3), "a", 3)
    tree.insert((1, 1, 1, 1), "a", 4)  # used again: now the newest
    dropped = tree.evict("a", max_tokens=8)
    assert dropped == 4
    assert tree.tenant_tokens("a") == 8
    assert tree.match((2, 2, 2, 2)) == {}
    assert tree.match((1, 1, 1, 1)) == {"a": 4}
    assert tree.match((3, 3, 3, 3)) == {"a": 4}
    assert tree.evict("a", max_tokens=100) == 0


def test_eviction_of_one_instance_keeps_shared_nodes_for_others() -> None:
    tree = PrefixTree()
    tree.insert((5, 6, 7), "a", 1)
    tree.insert((5, 6, 7), "b", 2)
    tree.evict("a", max_tokens=0)
    assert tree.match((5, 6, 7)) == {"b": 3}
    assert tree.tenant_tokens("a") == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
        min_size=1,
        max_size=25,
    ),
    st.lists(st.lists(st.integers(0, 3), max_size=9), min_size=1, max_size=5),
)
def test_match_agrees_with_a_brute_force_reference(
    inserts: list[tuple[str, list[int]]], queries: list[list[int]]
) -> None:
    tree = PrefixTree()
    held: dict[str, list[tuple[int, ...]]] = {}
    for stamp, (tenant, tokens) in enumerate(inserts):
        tree.insert(tokens, tenant, stamp)
        held.setdefault(tenant, []).append(tuple(tokens))
    for query in queries:
        expected = {t: max(common(tuple(query), s) for s in seqs) for t, seqs in held.items()}
        expected = {t: n for t, n in expected.items() if n > 0}
        assert tree.match(query) == expected
    for tenant, seqs in held.items():
        prefixes = {s[:k] for s in seqs for k in range(1, len(s) + 1)}
        assert tree.tenant_tokens(tenant) == len(prefixes)
