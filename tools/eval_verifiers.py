"""Held-out greedy evaluation of a model on a verifiers environment (the eval split of a run's task).

    .venv-verifiers/bin/python tools/eval_verifiers.py examples/verifiers/config.yaml --model DIR [overrides]

The configuration is the run's (a preset or YAML file, with overrides): its `task.name` and
`task.kwargs` build the environment, `env.max_turn_tokens` caps each model call, as in the run. The
model (`--model`: a model directory, the run's `model.path` by default, or a checkpoint such as
`runs/<run>/checkpoints/step_00000024/policy`) answers through psrl's own gateway over an embedded
engine, greedily, with the run's chat template; every example of the environment's `eval_dataset`
(or the first `--num-examples`) is one rollout of the environment's own loop, scored by its rubric
(`psrl.tasks.verifiers_eval`). Multi-turn environments end at their own turn limit. Prints the mean
reward, the pass rate at the environment's `pass_threshold` and the failed rollouts, then

    RESULT mean_reward=... pass_rate=... examples=... failed=...
"""

from __future__ import annotations

import argparse
import asyncio
import time

from psrl.config import load_config
from psrl.config.loader import split_preset

MODEL_NAME = "psrl"  # the name the gateway serves


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("args", nargs="*", help="the run's preset or YAML file, then key=value overrides")
    parser.add_argument("--model", help="model directory or checkpoint (default: the config's model.path)")
    parser.add_argument("--num-examples", type=int, default=-1, help="eval examples (-1: the whole split)")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    parser.add_argument("--threads", type=int, default=0, help="the engine's torch threads (0: torch's default)")
    return parser.parse_args()


def main() -> None:
    from psrl.assets import DEMO_MODEL_DIR
    from psrl.gateway.local import EngineGateway
    from psrl.gateway.sessions import Settings
    from psrl.tasks.verifiers_eval import NoEvalSplitError, eval_examples, evaluate, gateway_sessions
    from psrl.tasks.verifiers_source import is_verifiers, load_env

    args = parse_args()
    preset, overrides = split_preset(tuple(args.args))
    config = load_config(preset, list(overrides))
    task = config.task.name
    if not is_verifiers(task):
        raise SystemExit(f"task.name={task!r}: not a verifiers task; fix: task.name=verifiers:<env>")
    env = load_env(task, dict(config.task.kwargs))
    try:
        examples = eval_examples(env, task, args.num_examples)
    except NoEvalSplitError as error:
        raise SystemExit(str(error)) from None
    model_dir = str(args.model or config.model.path or DEMO_MODEL_DIR)
    settings = Settings(max_turn_tokens=config.env.max_turn_tokens)
    started = time.monotonic()
    with EngineGateway(model_dir, settings=settings, temperature=0.0, torch_threads=args.threads) as gateway:
        clients, sampling = gateway_sessions(gateway.url), dict(env.sampling_args)
        run = evaluate(
            env, task, examples, clients, model=MODEL_NAME, sampling_args=sampling, concurrency=args.concurrency
        )
        scores = asyncio.run(run)
    print(f"{task} on {model_dir}: {len(examples)} held-out examples, greedy, in {time.monotonic() - started:.0f} s")
    print(f"mean reward {scores.mean_reward:.3f}, pass rate {scores.pass_rate:.3f} (reward >= {scores.pass_threshold})")
    for failure in scores.failures:
        print(f"  failed: {failure}")
    print(f"RESULT mean_reward={scores.mean_reward:.4f} pass_rate={scores.pass_rate:.4f} "
          f"examples={len(scores.rewards)} failed={len(scores.failures)}")  # fmt: skip


if __name__ == "__main__":
    main()
