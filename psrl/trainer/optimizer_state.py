"""Adam(W) state allocated up front, exactly as ``torch.optim.Adam`` would on its first step.

Under ``psrl.tms`` the optimizer state lives in a region that is copied to the host on every pause; letting
the first ``step`` allocate it there would also leave that step's temporaries cached in the region, to be
copied each time. Allocating the state here, in the region, and stepping outside it copies only the state.
tests/trainer/test_optimizer_state.py checks that training is unchanged.
"""

from __future__ import annotations

import torch


def allocate_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the empty state of every parameter that has none (Adam and AdamW; other optimizers: refused)."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise TypeError(f"cannot allocate the state of {type(optimizer).__name__} up front")
    for group in optimizer.param_groups:
        on_device = group["capturable"] or group["fused"]
        for param in group["params"]:
            state = optimizer.state[param]
            if state:
                continue
            scalar_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state["step"] = (
                torch.zeros((), dtype=torch.float32 if group["fused"] else scalar_dtype, device=param.device)
                if on_device
                else torch.tensor(0.0, dtype=scalar_dtype, device="cpu")
            )
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
