"""A real rollout actor whose weight puller is built without the run's CURVE keys: over CURVE every pull
it makes is refused at the handshake, so the run stalls once the instances must sync (a fault made on
purpose, for the launcher's stall watch)."""

from __future__ import annotations

from typing import Any

import actors.rollout as rollout_module
from actors.rollout import RolloutActor


class RolloutWithoutPullKeys(RolloutActor):
    def setup(self) -> dict[str, int]:
        make_puller = rollout_module.make_puller

        def without_keys(*args: Any, curve: Any = None, **kwargs: Any) -> Any:
            return make_puller(*args, **kwargs)

        rollout_module.make_puller = without_keys  # type: ignore[assignment]
        try:
            return super().setup()
        finally:
            rollout_module.make_puller = make_puller
