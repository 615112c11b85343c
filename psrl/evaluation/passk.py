"""pass@k: the chance that at least one of k answers drawn from n is correct (unbiased estimator)."""

from __future__ import annotations

from math import comb


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k) for n samples of which c are correct (Chen et al., 2021)."""
    if not 0 <= num_correct <= num_samples or not 1 <= k <= num_samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= n and 0 <= c <= n, got n={num_samples}, c={num_correct}")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - comb(num_samples - num_correct, k) / comb(num_samples, k)
