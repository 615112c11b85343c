"""Per-request response lengths for long-tail workloads (``task.response_lengths=long_tail``).

Real reasoning traces have a heavy tail: most responses are short, a few run to the length
limit and dominate a synchronous step. A log-normal with the configured median and sigma,
capped at ``max_response_length``, reproduces that; the engine generates exactly the drawn length
(end-of-sequence ignored, no stop tokens, and none masked: the tokens are samples of the policy
itself, so the rollout's log-probs are the trainer's and the on-device decode rounds apply).
Each length is a pure function of (seed, request id), so reruns and replays see the same workload.
"""

from __future__ import annotations

import math
import random

from psrl.config.system import TaskSettings


def forced_length(task: TaskSettings, request_id: int) -> int | None:
    """The response length request ``request_id`` must generate, or None for natural lengths."""
    if task.response_lengths == "natural":
        return None
    rng = random.Random(f"length:{task.seed}:{request_id}")
    length = task.long_tail_median * math.exp(task.long_tail_sigma * rng.gauss(0.0, 1.0))
    return max(1, min(task.max_response_length, round(length)))
