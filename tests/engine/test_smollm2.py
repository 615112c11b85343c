"""The engine on a real small model: SmolLM2-135M-Instruct, converted by tools/convert_smollm2.py."""

from __future__ import annotations

import pytest
import torch

from psrl.engine import Engine, EngineArgs, SamplingParams
from tools.convert_smollm2 import default_output_dir

MODEL_DIR = default_output_dir()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (MODEL_DIR / "model.safetensors").is_file(),
        reason=f"no converted SmolLM2 at {MODEL_DIR}; run tools/convert_smollm2.py (see its docstring)",
    ),
]


def test_smollm2_greedy_matches_transformers_and_answers() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    reference = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    questions = ["What is the capital of France?", "Name three primary colours.", "What is 12 times 12?"]
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    engine = Engine(EngineArgs(model_path=MODEL_DIR, dtype="float32", device="cpu", num_kv_blocks=128))
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, SamplingParams(max_tokens=24, temperature=0.0))
    results = {}
    while engine.has_unfinished_requests():
        results.update((r.request_id, r) for r in engine.step().finished)
    for index, prompt in enumerate(prompts):
        with torch.no_grad():
            want = reference.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
        got = results[str(index)].output_ids
        assert got == want.tolist()[: len(got)], questions[index]
        full = torch.tensor([prompt + got])
        with torch.no_grad():
            reference_logprobs = torch.log_softmax(reference(full).logits[0].float(), -1)
        expected = [reference_logprobs[len(prompt) - 1 + i, token].item() for i, token in enumerate(got)]
        assert results[str(index)].logprobs == pytest.approx(expected, abs=1e-3)
    assert "Paris" in tokenizer.decode(results["0"].output_ids)
