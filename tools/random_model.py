"""Write a randomly initialised model with a real model's body and the demo task's tokenizer.

End-to-end throughput on a GPU needs a model of realistic size, while the demo task (its prompts
and reward) needs the demo tokenizer. This writes a Qwen2 checkpoint whose layers have the shape of
a published model and whose vocabulary is the demo tokenizer's, so `psrl launch` and
`tools/bench_e2e.py` run it with `model.path=DIR` (the reward stays computable; the model learns
from scratch, so it is a throughput workload, not a learning one).

    python tools/random_model.py --shape qwen2.5-0.5b --out /tmp/qwen05-body
    python tools/bench_e2e.py topology.device=cuda model.path=/tmp/qwen05-body
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from psrl.engine import DEMO_MODEL_DIR
from psrl.models.shapes import BODIES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def write_model(shape: str, out: Path, seed: int = 0, max_positions: int | None = None) -> int:
    """Write the checkpoint; returns its number of parameters."""
    demo = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    config = Qwen2Config(
        **BODIES[shape],
        vocab_size=demo["vocab_size"],
        max_position_embeddings=max_positions or demo["max_position_embeddings"],
        eos_token_id=demo["eos_token_id"],
        pad_token_id=demo["pad_token_id"],
        bos_token_id=None,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (DEMO_MODEL_DIR / name).exists():
            shutil.copy(DEMO_MODEL_DIR / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(BODIES), default="qwen2.5-0.5b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=None, help="context length (default: the demo's)")
    args = parser.parse_args()
    num_params = write_model(args.shape, args.out, args.seed, args.max_positions)
    print(f"wrote {args.out}: {args.shape} body, {num_params / 1e6:.0f} M parameters, demo tokenizer")


if __name__ == "__main__":
    main()
