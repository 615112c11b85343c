"""One data-parallel trainer rank, run as its own process by test_data_parallel.py.

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. \
    python dp_worker.py MODEL_DIR OUT_DIR STRATEGY ESTIMATOR [KEY=VALUE ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from trainer_helpers import NUM_DP_BUFFERS, make_buffer, trainer_config

from psrl.trainer import ParallelContext, TrainerCore


def main(model_dir: str, out_dir: str, strategy: str, estimator: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    parallel = ParallelContext.from_env(device="cpu")
    config = trainer_config([f"actor.strategy={strategy}", f"algorithm.adv_estimator={estimator}", *overrides])
    core = TrainerCore(config, model_dir=model_dir, parallel=parallel)
    metrics = [core.train_buffer(b, make_buffer(b)).metrics for b in range(NUM_DP_BUFFERS)]
    weights = {name: tensor.cpu().contiguous() for name, tensor in core.named_weights()}  # collective
    checkpoint = core.save_checkpoint(Path(out_dir) / "checkpoints")  # collective
    resumed = TrainerCore(config, model_dir=model_dir, parallel=parallel)  # every rank reads the checkpoint
    resumed.load_checkpoint(checkpoint)
    same = all(torch.equal(t.cpu(), weights[n]) for n, t in resumed.named_weights())
    if parallel.rank == 0:
        save_file(weights, str(Path(out_dir) / "weights.safetensors"))
        result = {"metrics": metrics, "checkpoint": str(checkpoint), "resumed_equal": same, "version": resumed.version}
        (Path(out_dir) / "result.json").write_text(json.dumps(result))
    parallel.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
