"""psrl against TRL's GRPOTrainer, side by side: the same model, prompts, reward and optimisation.

One invocation trains the same workload three ways, several times, alternating the order:

  trl    TRL's GRPOTrainer in one process with 2 torch threads (its own venv: `make install-trl`)
  sync   psrl synchronous (`psrl.staleness=0`), otherwise at its defaults
  async  psrl at its defaults (the demo preset: staleness 2, partial rollout)

The workload is the demo preset's (read from psrl's configuration, so both sides get psrl's
values): the demo task's prompts in index order (TRL gets the same texts; their token ids are
checked equal), psrl's own scorer as TRL's reward function, group size, batch, generation length,
learning rate, AdamW and its betas, clipping, temperature 1.0 and number of steps. A step is one
batch (16 prompts x 8 responses, 4 AdamW updates of 4 groups, in both). Each final model is
evaluated by the same code here (greedy, the task's held-out prompts, exact match). Prints the
settings it could not match, a table per run, medians per system and last

    RESULT speedup_vs_trl_sync=... speedup_vs_trl_async=... wall_vs_trl=... first_step_s=... acc_psrl=... acc_trl=...

(speedups: TRL's median s/step over psrl's; wall: psrl's whole command over TRL's; psrl = its defaults;
the line goes on with throughput_vs_trl_*: the same ratio of mean intervals from the first step's end to the
last's, which an asynchronous run's bursty intervals cannot flatter).

    make install-trl && .venv/bin/python tools/bench_peer_trl.py                 # demo model, CPU, 40 steps x 2
    .venv/bin/python tools/bench_peer_trl.py --steps 10 --repeats 1               # a quick look
    .venv/bin/python tools/bench_peer_trl.py --systems trl,async --repeats 5 --vary-seed   # accuracy over 5 seeds
    .venv/bin/python tools/bench_peer_trl.py --model smollm2                      # tools/convert_smollm2.py first
    .venv/bin/python tools/bench_peer_trl.py --device cuda                        # TRL without vLLM
    .venv/bin/python tools/bench_peer_trl.py --device cuda --model /tmp/m05 --steps 6 --repeats 1 \
        psrl.staleness_buffer_entries=64 actor.ppo_mini_batch_size=16 task.max_response_length=128 \
        engine.max_num_seqs=256 engine.num_kv_blocks=4096         # a 0.5B body (tools/random_model.py)
    .venv/bin/python tools/bench_peer_trl.py --model smollm2 --config examples/reasoning_gym/word_reversal.yaml \
        --systems trl,async --steps 24 --repeats 1                                # an external task

Positional ``key=value`` overrides go to psrl's configuration and so to both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.peer_trl import (
    Workload,
    edge_means,
    format_result,
    median,
    result_values,
    step_timing,
    trl_config_kwargs,
    unmatched_settings,
    workload_from_config,
)

REPO = Path(__file__).resolve().parents[1]
TRL_PYTHON = REPO / ".venv-trl" / "bin" / "python"
SYSTEMS = ("trl", "sync", "async")
PSRL_MODE = {"sync": ["psrl.staleness=0"], "async": []}


@dataclass
class RunRecord:
    system: str
    repeat: int
    wall_s: float
    first_step_s: float
    s_per_step: float
    mean_s_per_step: float
    rewards: list[float]
    model_dir: Path
    acc: float = float("nan")
    notes: list[str] = field(default_factory=list)


def workload_task(work: Workload) -> Any:
    """The run's task as psrl's coordinator builds it (a reasoning-gym task renders its prompts with the
    model's chat template), for TRL's prompts and reward and for the evaluation."""
    from transformers import AutoTokenizer

    from psrl.config import load_config
    from psrl.flows.task_source import make_task

    return make_task(load_config(work.config, list(work.overrides)), AutoTokenizer.from_pretrained(work.model_dir))


# ---------------------------------------------------------------------------------------- the TRL side


def trl_inputs(work: Workload) -> tuple[Any, Any, list[float], bool]:
    """TRL's dataset (psrl's prompts in index order) and reward function (psrl's task reward), the list the
    reward function appends each step's mean reward to, and whether both tokenize the prompts alike."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    task = workload_task(work)
    prompts = [task.prompt(i) for i in range(work.steps * work.groups)]
    tokenizer = AutoTokenizer.from_pretrained(work.model_dir)
    # TRL tokenizes a plain-text prompt as the processing class does by default; psrl as tokenizer.encode
    ids_match = all(tokenizer(p.text)["input_ids"] == tokenizer.encode(p.text) for p in prompts)
    rewards: list[float] = []

    def demo_reward(prompts: list[str], completions: list[str], index: list[int], **_: Any) -> list[float]:
        scores = [task.reward(task.prompt(i), text).score for i, text in zip(index, completions, strict=True)]
        rewards.append(sum(scores) / len(scores))  # one call per generation batch = one step
        return scores

    dataset = Dataset.from_dict({"prompt": [p.text for p in prompts], "index": [p.index for p in prompts]})
    return dataset, demo_reward, rewards, ids_match


def trl_child(spec_path: Path) -> None:
    """Runs in TRL's venv: train with GRPOTrainer, save the final model, write the step times and rewards."""
    spec = json.loads(spec_path.read_text())
    work = Workload.from_dict(spec["workload"])
    import torch

    torch.set_num_threads(spec["threads"])
    import trl
    from transformers import AutoTokenizer, TrainerCallback

    dataset, reward, rewards, ids_match = trl_inputs(work)
    step_ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % work.updates_per_step == 0:  # the last AdamW update of a batch
                step_ends.append(time.time())

    config = trl.GRPOConfig(**trl_config_kwargs(work, spec["output_dir"], spec["threads"], spec["device"]))
    trainer = trl.GRPOTrainer(model=work.model_dir, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=AutoTokenizer.from_pretrained(work.model_dir),
                              callbacks=[StepClock()])  # fmt: skip
    trainer.train()
    final = Path(spec["output_dir"]) / "final"
    trainer.save_model(str(final))
    out = {"step_ends": step_ends, "rewards": rewards, "model_dir": str(final), "ids_match": ids_match,
           "trl_version": trl.__version__, "device": str(trainer.model.device)}  # fmt: skip
    Path(spec["result"]).write_text(json.dumps(out))


def run_trl(work: Workload, root: Path, repeat: int, args: argparse.Namespace) -> RunRecord:
    out = root / f"trl-{repeat}"
    out.mkdir(parents=True, exist_ok=True)
    spec = {"workload": work.to_dict(), "output_dir": str(out), "threads": args.threads, "device": args.device,
            "result": str(out / "result.json")}  # fmt: skip
    (out / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [str(args.trl_python), str(Path(__file__).resolve()), "--child", str(out / "spec.json")]
    started, wall = timed(command, env, out / "log.txt")
    result = json.loads((out / "result.json").read_text())
    timing = step_timing(started, result["step_ends"])
    notes = [f"trl {result['trl_version']} on {result['device']}"]
    if not result["ids_match"]:
        notes.append("prompt token ids differ between TRL's tokenization and psrl's")
    if len(result["rewards"]) != work.steps:
        notes.append(f"reward called {len(result['rewards'])} times for {work.steps} steps")
    return RunRecord("trl", repeat, wall, timing.first_step_s, timing.s_per_step, timing.mean_s_per_step,
                     result["rewards"],
                     Path(result["model_dir"]), notes=notes)  # fmt: skip


def timed(command: list[str], env: dict[str, str], log: Path) -> tuple[float, float]:
    """Run ``command`` to its end (output to ``log``); its start (wall clock) and duration."""
    started = time.time()
    with log.open("w") as handle:
        code = subprocess.run(
            command, check=False, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO
        ).returncode
    wall = time.time() - started
    if code != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed (exit {code}); see {log}")
    return started, wall


# ---------------------------------------------------------------------------------------- the psrl side


def psrl_cli() -> list[str]:
    """The `psrl` command of this interpreter; its module where the script is not installed (a checkout on
    PYTHONPATH, as on a GPU machine with carried packages)."""
    script = Path(sys.executable).with_name("psrl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "psrl.cli.main"]


def run_psrl(system: str, overrides: list[str], work: Workload, root: Path, repeat: int) -> RunRecord:
    """`psrl launch <config>` as a user types it; times from its metrics (the trainer's step records)."""
    name = f"{system}-{repeat}"
    command = [*psrl_cli(), "launch", work.config, *overrides, *PSRL_MODE[system], "--root", str(root),
               "--name", name, "--quiet"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # the Makefile's default; actors set theirs
    started, wall = timed(command, env, root / f"{name}.log")
    run_dir = root / name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = sorted(
        (r for r in records if str(r.get("sender", "")).startswith("trainer") and "reward/mean" in r["values"]),
        key=lambda r: r["step"],
    )
    timing = step_timing(started, [r["wall_time"] for r in steps])
    checkpoint = run_dir / "checkpoints" / f"step_{work.steps:08d}" / "policy"
    return RunRecord(system, repeat, wall, timing.first_step_s, timing.s_per_step, timing.mean_s_per_step,
                     [r["values"]["reward/mean"] for r in steps], checkpoint)  # fmt: skip


# ---------------------------------------------------------------------------------------- evaluation


def evaluate(model_dir: Path, work: Workload, num_prompts: int, device: str) -> float:
    """Greedy exact-match accuracy on the task's held-out prompts: the same code for every final model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weight-loading bar per evaluation buries the results
    held_out = workload_task(work).held_out()  # type: ignore[attr-defined]
    tokenizer = AutoTokenizer.from_pretrained(work.model_dir)  # the original tokenizer for every model
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    eos = tokenizer.eos_token_id
    prompts = [held_out.prompt(index) for index in range(num_prompts)]
    by_length: dict[int, list[Any]] = {}
    for prompt in prompts:  # prompts of one length form a batch: no padding, so no model sees a different input
        by_length.setdefault(len(tokenizer.encode(prompt.text)), []).append(prompt)
    correct = 0.0
    for batch in by_length.values():
        ids = torch.tensor([tokenizer.encode(p.text) for p in batch], device=device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos, max_new_tokens=work.max_response_length)  # fmt: skip
        for prompt, row in zip(batch, out[:, ids.shape[1] :].tolist(), strict=True):
            tokens = row[: row.index(eos)] if eos in row else row
            correct += held_out.reward(prompt, tokenizer.decode(tokens, skip_special_tokens=True)).acc
    return correct / num_prompts


# ---------------------------------------------------------------------------------------- the invocation


def resolve_model(name: str) -> str | None:
    """The model directory of ``--model``, or None when it is not on this machine."""
    if name == "demo":
        from psrl.assets import DEMO_MODEL_DIR

        return str(DEMO_MODEL_DIR)
    if name == "smollm2":
        from tools.convert_smollm2 import default_output_dir

        path = default_output_dir()
    else:
        path = Path(name).expanduser()
    return str(path) if (path / "config.json").exists() else None


def build_workload(args: argparse.Namespace, seed_offset: int = 0) -> tuple[Workload, list[str]]:
    """The workload and psrl's overrides; ``seed_offset``: the prompt generator's and the trainer's seeds
    moved by that much on both sides (the engine's request seeds follow the task's)."""
    from psrl.config import load_config
    from psrl.preflight import checked

    model_dir = resolve_model(args.model)
    if model_dir is None:
        fix = ("run `make model-smollm2` (or tools/convert_smollm2.py) first" if args.model == "smollm2"
               else "give demo, smollm2 or a directory with a config.json")  # fmt: skip
        raise SystemExit(f"--model {args.model}: no model there; {fix}. Skipped.")
    overrides = [f"trainer.total_steps={args.steps}", *args.overrides]
    if args.model != "demo":
        overrides.append(f"model.path={model_dir}")
    if args.device == "cuda":
        overrides.append("topology.device=cuda")
    config = load_config(args.config, overrides)
    if seed_offset:
        seeds = config.task.seed + seed_offset, config.trainer.seed + seed_offset
        overrides += [f"task.seed={seeds[0]}", f"trainer.seed={seeds[1]}"]
        config = load_config(args.config, overrides)
    return workload_from_config(checked(config), model_dir, args.config, overrides, args.device), overrides


def run_all(work: Workload, overrides: list[str], root: Path, args: argparse.Namespace) -> list[RunRecord]:
    records = []
    systems = tuple(s for s in SYSTEMS if s in args.systems.split(","))
    for repeat in range(args.repeats):
        # alternate the order so that a drift in the machine's load favours no system
        order = systems if repeat % 2 == 0 else tuple(reversed(systems))
        seeded = build_workload(args, seed_offset=repeat) if args.vary_seed and repeat else (work, overrides)
        for system in order:
            print(f"  repeat {repeat + 1}/{args.repeats}: {system} ... (load {load_text()})", flush=True)
            if system == "trl":
                record = run_trl(seeded[0], root, repeat, args)
            else:
                record = run_psrl(system, seeded[1], seeded[0], root, repeat)
            record.acc = evaluate(record.model_dir, seeded[0], args.eval_prompts, args.device)
            print_record(record)
            records.append(record)
    return records


def load_text() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def print_record(r: RunRecord) -> None:
    first, last = edge_means(r.rewards)
    notes = f"  ({'; '.join(r.notes)})" if r.notes else ""
    print(f"    {r.system:>5} #{r.repeat}: {r.s_per_step:.3f} s/step (mean {r.mean_s_per_step:.3f}), whole command "
          f"{r.wall_s:.1f} s, first step {r.first_step_s:.1f} s, reward first 5 {first:.3f} -> last 5 {last:.3f}, "
          f"held-out acc {r.acc:.3f}{notes}", flush=True)  # fmt: skip


def system_medians(records: list[RunRecord]) -> dict[str, dict[str, float]]:
    out = {}
    for system in SYSTEMS:
        mine = [r for r in records if r.system == system]
        edges = [edge_means(r.rewards) for r in mine]
        out[system] = {
            "s_per_step": median([r.s_per_step for r in mine]),
            "mean_s_per_step": median([r.mean_s_per_step for r in mine]),
            "wall_s": median([r.wall_s for r in mine]),
            "first_step_s": median([r.first_step_s for r in mine]),
            "reward_first5": median([e[0] for e in edges]),
            "reward_last5": median([e[1] for e in edges]),
            "acc": median([r.acc for r in mine]),
        }
    return out


def print_summary(medians: dict[str, dict[str, float]], initial_acc: float) -> None:
    print(f"\nmedians over repeats (held-out greedy acc. of the initial model: {initial_acc:.3f})")
    print(f"  {'system':<25}{'s/step':>8}{'mean':>7}{'whole s':>9}{'first step s':>14}{'reward first5':>15}"
          f"{'last5':>7}{'acc':>7}")  # fmt: skip
    labels = {"trl": "TRL GRPOTrainer", "sync": "psrl sync (staleness 0)", "async": "psrl defaults"}
    for system, m in medians.items():
        print(f"  {labels[system]:<25}{m['s_per_step']:>8.3f}{m['mean_s_per_step']:>7.3f}{m['wall_s']:>9.1f}"
              f"{m['first_step_s']:>14.1f}{m['reward_first5']:>15.3f}{m['reward_last5']:>7.3f}"
              f"{m['acc']:>7.3f}")  # fmt: skip


def print_settings(work: Workload, args: argparse.Namespace) -> None:
    print(f"workload: model {work.model_dir}, task {work.task}, {work.steps} steps of {work.groups} prompts x "
          f"{work.group_size}, {work.updates_per_step} AdamW updates a step (lr {work.lr}, betas {work.betas}, "
          f"weight decay {work.weight_decay}, grad clip {work.grad_clip}), clip {work.clip_low}/{work.clip_high}, "
          f"kl {work.kl_coef}, up to {work.max_response_length} tokens at temperature {work.temperature}; "
          f"device {args.device}; TRL with {args.threads} torch threads; {args.repeats} repeats")  # fmt: skip
    print("settings not matched:")
    for row in unmatched_settings(work, args.device, args.threads):
        print(f"  - {row}")
    print(f"load average at start: {load_text()} ({os.cpu_count()} CPUs)", flush=True)
    if args.threads > 1 and os.getloadavg()[0] > (os.cpu_count() or 1):
        # torch's threads wait for each other at every operator: with the cores oversubscribed, one descheduled
        # thread stalls the other (a demo-model forward+backward measured 20 s at 2 threads, 0.5 s at 1, at load 14)
        print(f"warning: the cores are oversubscribed; TRL's {args.threads} torch threads will stall each other "
              "(--threads 1 measures TRL without that)")  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo",
                        help="demo, smollm2 (tools/convert_smollm2.py) or a model directory")  # fmt: skip
    parser.add_argument("--config", default="demo", help="psrl's configuration: a preset or a YAML file (both sides)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"which of {','.join(SYSTEMS)} to run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches) per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each system, the order alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--vary-seed", action="store_true",
                        help="repeat r: task.seed and trainer.seed + r on both sides (medians over seeds)")  # fmt: skip
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts per evaluation")
    parser.add_argument("--root", type=Path, default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON, help="the TRL venv's python")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="psrl config overrides (key=value), applied to both sides")
    args = parser.parse_args()
    unknown = sorted(set(args.systems.split(",")) - set(SYSTEMS))
    if unknown:
        parser.error(f"--systems {args.systems!r}: unknown {unknown}; use a comma list of {','.join(SYSTEMS)}")
    return args


def main() -> None:
    args = parse_args()
    if args.child is not None:
        trl_child(args.child)
        return
    if not args.trl_python.exists():
        raise SystemExit(f"{args.trl_python} not found: `make install-trl` first")
    work, overrides = build_workload(args)
    print_settings(work, args)
    if args.device == "cuda":
        print("TRL generates with HF generate (without vLLM: vLLM cannot reach the GPU machine)")
    root = args.root or Path(tempfile.mkdtemp(prefix="psrl-bench-trl-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records = run_all(work, overrides, root, args)
    initial_acc = evaluate(Path(work.model_dir), work, args.eval_prompts, args.device)
    medians = system_medians(records)
    print_summary(medians, initial_acc)
    print(f"load average at the end: {load_text()}; {time.monotonic() - started:.0f} s in all; runs under {root}")
    print(format_result(result_values(medians)))


if __name__ == "__main__":
    main()
