"""A token radix tree shared by all instances: which prefixes were routed to which instance.

Every distinct prefix is stored once; each node records the instances ("tenants") that hold it
and when they last used it. A tenant present on a node is present on all its ancestors, so one
walk down the tree gives every instance's longest cached prefix of a request. Time is a logical
stamp supplied by the caller, so the tree is deterministic and replayable.

Eviction is per tenant and least-recently-used: the tenant's leaves (nodes it holds with no
child it holds) are dropped oldest first until it holds at most ``max_tokens`` tokens.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "edge", "parent", "tenants")

    def __init__(self, edge: tuple[int, ...], parent: _Node | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.tenants: dict[str, int] = {}  # tenant -> last access stamp


def _common_prefix(edge: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of ``edge`` and ``tokens[start:]`` (slice compares run in C)."""
    limit = min(len(edge), len(tokens) - start)
    if tokens[start : start + limit] == edge[:limit]:
        return limit
    low, high = 0, limit  # invariant: the first `low` match, the first `high` do not
    while high - low > 1:
        mid = (low + high) // 2
        if tokens[start : start + mid] == edge[:mid]:
            low = mid
        else:
            high = mid
    return low


class PrefixTree:
    def __init__(self) -> None:
        self._root = _Node((), None)
        self._tenant_tokens: dict[str, int] = {}

    def tenant_tokens(self, tenant: str) -> int:
        """Tokens held by ``tenant`` (the size that eviction bounds)."""
        return self._tenant_tokens.get(tenant, 0)

    @property
    def tokens_by_tenant(self) -> dict[str, int]:
        """Tokens held per tenant (read-only view; do not modify)."""
        return self._tenant_tokens

    def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        """Longest prefix of ``token_ids`` held by each tenant (tenants with no match are absent).

        Tenant sets only shrink going down, so a tenant's match is where it drops out of the
        path; sets are compared only when their sizes differ, which keeps a walk near O(tenants).
        """
        tokens = tuple(token_ids)
        matched: dict[str, int] = {}
        held: dict[str, int] = {}  # tenants of the deepest fully matched node
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            if len(child.tenants) != len(held):
                for tenant in held:
                    if tenant not in child.tenants:
                        matched[tenant] = pos
            common = _common_prefix(child.edge, tokens, pos)
            held = child.tenants
            pos += common
            if common < len(child.edge):
                break
            node = child
        matched.update(dict.fromkeys(held, pos))
        return matched

    def insert(self, token_ids: Sequence[int], tenant: str, stamp: int) -> None:
        """Record that ``tenant`` now holds the prefix ``token_ids``, used at ``stamp``."""
        tokens = tuple(token_ids)
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                child = _Node(tokens[pos:], node)
                node.children[tokens[pos]] = child
            common = _common_prefix(child.edge, tokens, pos)
            if common < len(child.edge):
                child = self._split(child, common)
            if tenant not in child.tenants:
                self._tenant_tokens[tenant] = self._tenant_tokens.get(tenant, 0) + len(child.edge)
            child.tenants[tenant] = stamp
            node, pos = child, pos + common

    def remove_tenant(self, tenant: str) -> None:
        """Forget everything ``tenant`` holds (its KV cache was cleared)."""
        if tenant not in self._tenant_tokens:
            return
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.tenants.pop(tenant, None) is None:
                continue  # descendants cannot hold it either
            stack.extend(node.children.values())
            self._prune(node)
        del self._tenant_tokens[tenant]

    def evict(self, tenant: str, max_tokens: int) -> int:
        """Drop ``tenant``'s least recently used leaves until it holds <= ``max_tokens``; returns tokens dropped."""
        excess = self.tenant_tokens(tenant) - max_tokens
        if excess <= 0:
            return 0
        # (stamp, tie-break counter, node): the counter keeps the order deterministic
        heap = [(node.tenants[tenant], i, node) for i, node in enumerate(self._tenant_leaves(tenant))]
        heapq.heapify(heap)
        counter, dropped = len(heap), 0
        while heap and dropped < excess:
            _, _, node = heapq.heappop(heap)
            del node.tenants[tenant]
            dropped += len(node.edge)
            parent = node.parent
            self._prune(node)
            if parent is not None and parent is not self._root and self._is_tenant_leaf(parent, tenant):
                heapq.heappush(heap, (parent.tenants[tenant], counter, parent))
                counter += 1
        self._tenant_tokens[tenant] -= dropped
        return dropped

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` tokens; returns the new upper node."""
        parent = node.parent
        if parent is None:
            raise ValueError("cannot split the root")
        upper = _Node(node.edge[:at], parent)
        upper.tenants = dict(node.tenants)
        parent.children[node.edge[0]] = upper
        node.edge = node.edge[at:]
        node.parent = upper
        upper.children[node.edge[0]] = node
        return upper

    def _tenant_leaves(self, tenant: str) -> list[_Node]:
        leaves, stack = [], [n for n in self._root.children.values() if tenant in n.tenants]
        while stack:
            node = stack.pop()
            held = [c for c in node.children.values() if tenant in c.tenants]
            if held:
                stack.extend(held)
            else:
                leaves.append(node)
        return leaves

    @staticmethod
    def _is_tenant_leaf(node: _Node, tenant: str) -> bool:
        return tenant in node.tenants and not any(tenant in c.tenants for c in node.children.values())

    def _prune(self, node: _Node) -> None:
        """Unlink nodes nobody holds, walking up while they are empty leaves."""
        while node.parent is not None and not node.tenants and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
