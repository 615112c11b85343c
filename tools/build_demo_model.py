"""Build the demo policy: a character tokenizer and a small Qwen2 model SFT-trained on the demo task.

The model is deliberately imperfect: training stops once the mean reward of temperature-1 samples
on held-out prompts reaches --target-score, so an RL run has clear room to improve it. Evaluation
runs on psrl's own engine. The result (HF layout: config.json, generation_config.json,
model.safetensors, tokenizer files) goes to psrl/assets/demo_model by default.

    .venv/bin/python tools/build_demo_model.py [--out DIR] [--target-score 0.35] [--max-minutes 8]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.tasks import DemoTask, Prompt

REPO = Path(__file__).resolve().parent.parent
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHARACTERS = [" ", "="] + [str(digit) for digit in range(10)] + [chr(code) for code in range(ord("a"), ord("z") + 1)]
EVAL_SEED = 10_000  # held-out prompts come from a task seed never used in training


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, as a byte-level BPE without merges.

    Byte-level (space is the symbol 'Ġ') because transformers' AutoTokenizer loads a qwen2 checkpoint's
    tokenizer as Qwen2Tokenizer, which re-applies byte-level pre-tokenization: this layout gives the
    same ids through AutoTokenizer and PreTrainedTokenizerFast.
    """
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for character in CHARACTERS:
        vocab["Ġ" if character == " " else character] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD, unk_token=UNK)


def build_config(vocab_size: int, args: argparse.Namespace) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=(vocab_size + 7) // 8 * 8,
        hidden_size=args.hidden_size,
        intermediate_size=args.hidden_size * 3,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.hidden_size // 32,
        num_key_value_heads=max(1, args.hidden_size // 64),
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )


def make_batch(
    prompts: list[Prompt], tokenizer: PreTrainedTokenizerFast, label_noise: float, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids, attention mask and labels (loss on the answer and its end token only).

    With label_noise > 0 that fraction of answer characters is replaced by a random digit, so the
    model learns a spread-out distribution around the right answer: temperature-1 samples are
    often wrong while the most likely answer is often right, which is what RL sharpens quickly.
    """
    rows, label_rows = [], []
    for prompt in prompts:
        prompt_ids = tokenizer.encode(prompt.text)
        answer = "".join(str(rng.randrange(10)) if rng.random() < label_noise else c for c in prompt.answer)
        answer_ids = [*tokenizer.encode(answer), tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        label_rows.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    labels = torch.tensor([row + [-100] * (width - len(row)) for row in label_rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return input_ids, mask, labels


def length_grouped_batches(task: DemoTask, rng: random.Random, batch_size: int, num: int = 8) -> list[list[Prompt]]:
    """`num` batches of similar-length examples, in random order: padding would otherwise triple the work."""
    prompts = sorted((task.prompt(rng.randrange(10**9)) for _ in range(batch_size * num)), key=_example_length)
    batches = [prompts[index : index + batch_size] for index in range(0, len(prompts), batch_size)]
    rng.shuffle(batches)
    return batches


def _example_length(prompt: Prompt) -> int:
    return len(prompt.text) + len(prompt.answer)


def learning_rate(step: int, args: argparse.Namespace) -> float:
    warmup = 50
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, args.max_steps - warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def evaluate(model: Qwen2ForCausalLM, config_dir: Path, tokenizer: PreTrainedTokenizerFast, num: int) -> dict:
    """Mean reward and exact-match rate of temperature-1 samples and of greedy answers (psrl engine)."""
    task = DemoTask(seed=EVAL_SEED)
    engine = Engine(EngineArgs(model_path=config_dir, dtype="float32", device="cpu"), weights=model.state_dict())
    prompts = [task.prompt(index) for index in range(num)]
    results = {}
    for mode, temperature in (("sampled", 1.0), ("greedy", 0.0)):
        for prompt in prompts:
            params = SamplingParams(max_tokens=200, temperature=temperature, seed=prompt.index)
            engine.add_request(f"{mode}-{prompt.index}", tokenizer.encode(prompt.text), params)
        texts = {}
        while engine.has_unfinished_requests():
            for done in engine.step().finished:
                texts[done.request_id] = tokenizer.decode(done.output_ids, skip_special_tokens=True)
        rewards = [task.reward(p, texts[f"{mode}-{p.index}"]) for p in prompts]
        results[f"{mode}_score"] = sum(r.score for r in rewards) / num
        results[f"{mode}_acc"] = sum(r.acc for r in rewards) / num
    return results


def train(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast, config_dir: Path) -> Qwen2ForCausalLM:
    torch.manual_seed(args.seed)
    if args.init_from is not None:
        model = Qwen2ForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)
    else:
        model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(config_dir))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    # training lengths are uniform (not the task's short-skewed mix) so long strings are seen often
    task, rng = DemoTask(seed=args.seed, length_skew=args.train_length_skew), random.Random(args.seed)
    started = time.monotonic()
    batches: list[list[Prompt]] = []
    for step in range(args.max_steps):
        if not batches:
            batches = length_grouped_batches(task, rng, args.batch_size)
        input_ids, mask, labels = make_batch(batches.pop(), tokenizer, args.label_noise, rng)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        minutes = (time.monotonic() - started) / 60
        if (step + 1) % args.eval_every == 0 or minutes > args.max_minutes:
            model.eval()
            metrics = evaluate(model, config_dir, tokenizer, args.num_eval)
            model.train()
            print(json.dumps({"step": step + 1, "minutes": round(minutes, 2), "loss": round(loss.item(), 4),
                              **{k: round(v, 3) for k, v in metrics.items()}}), flush=True)  # fmt: skip
            if metrics["sampled_score"] >= args.target_score or minutes > args.max_minutes:
                break
    return model


def save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    tokenizer.save_pretrained(out)
    # a class name transformers 4.x knows too (5.x writes its own backend name)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "psrl" / "assets" / "demo_model")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--max-minutes", type=float, default=8.0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--num-eval", type=int, default=96)
    parser.add_argument("--target-score", type=float, default=0.35)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokenizer-only", action="store_true", help="only (re)write the tokenizer files in --out")
    parser.add_argument("--init-from", type=Path, help="continue training this checkpoint")
    parser.add_argument("--label-noise", type=float, default=0.15, help="fraction of answer characters randomised")
    parser.add_argument("--train-length-skew", type=float, default=1.0, help="length skew of training prompts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    if args.tokenizer_only:
        save_tokenizer(tokenizer, args.out)
        return
    with tempfile.TemporaryDirectory() as scratch:
        config_dir = Path(scratch)
        build_config(len(tokenizer), args).save_pretrained(config_dir)
        model = train(args, tokenizer, config_dir)
    save(model, tokenizer, args.out)
    size_mb = (args.out / "model.safetensors").stat().st_size / 1e6
    print(f"saved {args.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params, {size_mb:.1f} MB)")


if __name__ == "__main__":
    main()
