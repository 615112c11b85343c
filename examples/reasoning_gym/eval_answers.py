"""The most frequent held-out answers of each evaluation of a finished run, read from its event log.

A held-out accuracy that rises to the share of one answer in the held-out split is a policy that
answers that constant to everything, not one that learned the task; this shows which it is:

    .venv/bin/python examples/reasoning_gym/eval_answers.py runs/<name> [--top 8]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from transformers import AutoTokenizer

from bus.eventlog.reader import EventLogReader
from bus.messages import EvalResult
from psrl.assets import DEMO_MODEL_DIR
from psrl.config.loader import load_config


def answers_by_version(run_dir: Path) -> dict[int, Counter[str]]:
    config = load_config(str(run_dir / "config.yaml"), [])
    tokenizer = AutoTokenizer.from_pretrained(str(Path(config.model.path or DEMO_MODEL_DIR).expanduser()))
    answers: dict[int, Counter[str]] = defaultdict(Counter)
    for logged in EventLogReader(run_dir / "events").events():
        result = logged.event.message
        if isinstance(result, EvalResult):
            answers[result.version][tokenizer.decode(result.token_ids, skip_special_tokens=True)] += 1
    return dict(answers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--top", type=int, default=8, help="answers shown per evaluation")
    args = parser.parse_args()
    for version, counts in sorted(answers_by_version(args.run_dir).items()):
        shown = ", ".join(f"{answer!r} {n}" for answer, n in counts.most_common(args.top))
        print(f"v{version}: {sum(counts.values())} answers, {len(counts)} distinct: {shown}")


if __name__ == "__main__":
    main()
