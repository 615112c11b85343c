"""Modelled tool latency: the extra wall time of one environment step, drawn per (session, turn)."""

from __future__ import annotations

import math
import random

from psrl.config.system import Env


def step_delay_s(settings: Env, request_id: int, turn: int, seed: int = 0) -> float:
    """Seconds one step waits on top of its real work (the same session and turn always wait the same)."""
    mean = settings.latency_ms / 1000
    if mean <= 0:
        return 0.0
    rng = random.Random(f"env-latency:{seed}:{request_id}:{turn}")
    if settings.latency_distribution == "fixed":
        return mean
    if settings.latency_distribution == "exponential":
        return rng.expovariate(1 / mean)
    sigma = 1.0  # lognormal with the configured mean: mu = ln(mean) - sigma^2 / 2
    return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)
