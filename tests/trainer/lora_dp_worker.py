"""One data-parallel LoRA trainer rank, run as its own process by test_lora_data_parallel.py.

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python lora_dp_worker.py MODEL_DIR OUT_DIR STRATEGY
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

LORA = ["actor.lora.rank=4", "actor.lora.alpha=8"]


def main(model_dir: str, out_dir: str, strategy: str) -> None:
    torch.set_num_threads(1)
    parallel = ParallelContext.from_env(device="cpu")
    config = trainer_config([f"actor.strategy={strategy}", *LORA])
    core = TrainerCore(config, model_dir=model_dir, parallel=parallel)
    for buffer_id in range(NUM_DP_BUFFERS):
        core.train_buffer(buffer_id, make_buffer(buffer_id))
    adapters = {name: tensor.cpu().contiguous() for name, tensor in core.named_weights()}  # collective
    checkpoint = core.save_checkpoint(Path(out_dir) / "checkpoints")  # collective
    resumed = TrainerCore(config, model_dir=model_dir, parallel=parallel)
    resumed.load_checkpoint(checkpoint)
    same = all(torch.equal(t.cpu(), adapters[n]) for n, t in resumed.named_weights())
    if parallel.rank == 0:
        save_file(adapters, str(Path(out_dir) / "adapters.safetensors"))
        (Path(out_dir) / "result.json").write_text(json.dumps({"resumed_equal": same}))
    parallel.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
