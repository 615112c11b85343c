"""Adam(W) state allocated up front trains exactly like the state torch allocates on the first step."""

from __future__ import annotations

import pytest
import torch

from psrl.trainer.optimizer_state import allocate_adam_state


@pytest.mark.parametrize("amsgrad", [False, True])
def test_upfront_state_gives_the_same_steps(amsgrad: bool) -> None:
    torch.manual_seed(0)
    start = torch.randn(16, 8)
    grads = [torch.randn(16, 8) for _ in range(3)]
    results = []
    for upfront in (False, True):
        param = torch.nn.Parameter(start.clone())
        optimizer = torch.optim.AdamW([param], lr=0.01, weight_decay=0.1, amsgrad=amsgrad)
        if upfront:
            allocate_adam_state(optimizer)
            assert set(optimizer.state[param]) >= {"step", "exp_avg", "exp_avg_sq"}
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        results.append((param.detach().clone(), optimizer.state[param]["exp_avg_sq"].clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_other_optimizers_are_refused() -> None:
    with pytest.raises(TypeError, match="SGD"):
        allocate_adam_state(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1))
