"""A set of integer ids held as sorted disjoint ranges: every id a router has taken, in little memory.

Request ids are handed out in ascending runs (a prompt's children, prompt after prompt), so a long
run's millions of ids collapse into a handful of ranges, where a plain set would hold each one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class IdRanges:
    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._starts: list[int] = []  # range i is [starts[i], ends[i])
        self._ends: list[int] = []
        for id_ in ids:
            self.add(id_)

    def __contains__(self, id_: int) -> bool:
        i = bisect.bisect_right(self._starts, id_) - 1
        return i >= 0 and id_ < self._ends[i]

    def __len__(self) -> int:
        return sum(end - start for start, end in zip(self._starts, self._ends, strict=True))

    @property
    def num_ranges(self) -> int:
        return len(self._starts)

    def add(self, id_: int) -> None:
        i = bisect.bisect_right(self._starts, id_) - 1  # the range starting at or before id_
        if i >= 0 and id_ < self._ends[i]:
            return
        joins_left = i >= 0 and self._ends[i] == id_
        joins_right = i + 1 < len(self._starts) and self._starts[i + 1] == id_ + 1
        if joins_left and joins_right:
            self._ends[i] = self._ends.pop(i + 1)
            del self._starts[i + 1]
        elif joins_left:
            self._ends[i] = id_ + 1
        elif joins_right:
            self._starts[i + 1] = id_
        else:
            self._starts.insert(i + 1, id_)
            self._ends.insert(i + 1, id_ + 1)
