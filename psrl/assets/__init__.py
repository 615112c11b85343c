"""Files shipped with psrl.

`demo_model/`: the demo policy (HF layout: config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json), a small Qwen2 model SFT-trained on the `demo` task by
tools/build_demo_model.py and left deliberately imperfect, so `psrl launch` runs with no download
and RL has room to improve it.
"""

from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
