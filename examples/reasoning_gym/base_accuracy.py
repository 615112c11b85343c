"""Held-out greedy accuracy of a model on a task before any training: the number a run must beat.

It answers the task's held-out prompts (the ones `trainer.eval_interval` evaluates) at temperature 0
with psrl's engine and scores them with the task's own reward, so the figure is the run's version-0
`eval/acc`. Takes the same key=value overrides as `psrl launch`:

    .venv/bin/python examples/reasoning_gym/base_accuracy.py examples/reasoning_gym/config.yaml eval.num_prompts=128
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from psrl.assets import DEMO_MODEL_DIR
from psrl.config.loader import load_config
from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.flows.prompts import TaskPrompts
from psrl.preflight import checked


def greedy_accuracy(preset: str, overrides: list[str]) -> tuple[float, list[tuple[str, str, float, float]]]:
    config = checked(load_config(preset, overrides))
    source = TaskPrompts(config)
    held_out = source.held_out(config)
    engine = Engine(
        EngineArgs(model_path=config.model.path or DEMO_MODEL_DIR, dtype="float32", device="cpu", num_kv_blocks=1024)
    )
    prompts = [held_out.prompt(i) for i in range(config.eval.num_prompts)]
    max_tokens = config.eval.max_tokens or config.task.max_response_length
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), held_out.token_ids(prompt).tolist(), SamplingParams(
            max_tokens=max_tokens, temperature=0.0, stop_token_ids=tuple(source.stop_token_ids)))  # fmt: skip
    finished: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        finished.update((r.request_id, r) for r in engine.step().finished)
    samples = []
    for i, prompt in enumerate(prompts):
        ids = finished[str(i)].output_ids
        reward = held_out.score(prompt, np.asarray(ids))
        samples.append(
            (prompt.answer, source.tokenizer.decode(ids, skip_special_tokens=True), reward.acc, reward.score)
        )
    return sum(s[2] for s in samples) / len(samples), samples


def main() -> None:
    accuracy, samples = greedy_accuracy(sys.argv[1], sys.argv[2:])
    for answer, response, acc, score in samples[:16]:
        print(f"answer={answer!r} acc={acc:.0f} score={score:.2f} response={response[:160]!r}")
    mean_score = sum(s[3] for s in samples) / len(samples)
    print(f"held-out greedy accuracy: {accuracy:.3f} (mean score {mean_score:.3f}) on {len(samples)} prompts")


if __name__ == "__main__":
    main()
