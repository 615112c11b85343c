"""What cache_aware_v1 asks of the offloaded (CPU) KV tier.

The tier itself belongs to the engine side; routing only needs, per instance, how long a
prefix of the request that tier could serve without recomputation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class OffloadTierView(Protocol):
    def match(self, token_ids: Sequence[int]) -> Mapping[str, int]:
        """Per instance, the leading tokens of ``token_ids`` whose KV its offloaded tier holds.

        Instances holding none may be left out.
        """
        ...
