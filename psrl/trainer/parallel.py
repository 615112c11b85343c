"""Data parallelism for the trainer: process group, model wrapping and the few collectives it needs.

One process per rank. `ParallelContext.from_env()` joins the process group described by the usual
torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): gloo on CPU, NCCL on
GPU. With a single rank nothing is initialised and every collective is the identity.

Wrapping (`actor.strategy`): `fsdp2` shards parameters, gradients and optimizer state with
`torch.distributed.fsdp.fully_shard` (per decoder layer, then the root); `ddp` replicates the model
and all-reduces gradients. Both average gradients over ranks, which `loss_scale` undoes because
the trainer's losses are already normalised by whole-mini-batch denominators.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

CLOSE_BARRIER_S = 10.0  # how long a closing rank waits for its peers before tearing down

Strategy = Literal["fsdp2", "ddp", "megatron"]


@dataclass
class ParallelContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    is_initialised_here: bool = False

    @classmethod
    def from_env(cls, device: str = "auto") -> ParallelContext:
        """Join the process group named by the environment (or stay single-rank)."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        torch_device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(torch_device)
        started = False
        if world_size > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
            started = True
        return cls(rank=rank, world_size=world_size, device=torch_device, is_initialised_here=started)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def loss_scale(self) -> float:
        """Gradient averaging over ranks divides by world_size; the losses are already global means."""
        return float(self.world_size)

    def wrap(self, model: nn.Module, strategy: Strategy) -> nn.Module:
        if not self.is_distributed:
            return model
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=device_ids)
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model

    @contextmanager
    def gradient_sync(self, model: nn.Module, *, enabled: bool) -> Iterator[None]:
        """Skip the gradient reduction of all but the last micro-batch of a mini-batch."""
        if enabled or not self.is_distributed:
            yield
            return
        no_sync = getattr(model, "no_sync", None)
        if no_sync is not None:  # DDP
            with no_sync():
                yield
            return
        set_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2
        if set_sync is None:
            with nullcontext():
                yield
            return
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        if self.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        if not self.is_distributed or not values:
            return values
        keys = sorted(values)
        summed = self.all_reduce_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device))
        return dict(zip(keys, summed.tolist(), strict=True))

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def close(self) -> None:
        if self.is_initialised_here and dist.is_initialized():
            if self.is_distributed and dist.get_backend() == "gloo":
                # Leave together: a rank that tears down while its peer still talks to the
                # rendezvous store aborts the peer. Bounded, since a peer may already be dead.
                with suppress(RuntimeError):
                    dist.monitored_barrier(timeout=timedelta(seconds=CLOSE_BARRIER_S))
            dist.destroy_process_group()


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a Hugging Face model (`*.layers`), if it has them."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    return []
