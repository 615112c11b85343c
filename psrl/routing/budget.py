"""Response-length estimate of throughput_optimal_with_budget: round generated tokens up to pages.

A request that has generated ``r`` tokens is assumed to need up to the end of its current
``budget``-token page, ``ceil((r + 1) / budget) * budget`` response tokens in total, so a fresh
request reserves one page and a continuation reserves the page it is in. Engines report the same
rounding summed over their running requests (``InstanceSnapshot.budget_kv_tokens``).
"""

from __future__ import annotations


def budget_response_tokens(num_response_tokens: int, budget: int) -> int:
    """Response tokens reserved for a request that has generated ``num_response_tokens`` so far."""
    if budget <= 0:
        raise ValueError(f"request_budget must be > 0, got {budget}")
    num_pages = (num_response_tokens + 1 + budget - 1) // budget
    return num_pages * budget


def budget_request_tokens(num_prompt_tokens: int, num_response_tokens: int, budget: int) -> int:
    """KV tokens a request is charged under the budget estimate: prompt plus budgeted response."""
    return num_prompt_tokens + budget_response_tokens(num_response_tokens, budget)
