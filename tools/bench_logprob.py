"""Fused, chunked log-prob and entropy (psrl.trainer.logprob) against materialised float32 logits.

Each variant runs in its own process: forward and backward of log-prob and entropy of `--tokens`
hidden states through an LM head of `--vocab` rows, timed (median of `--reps`) and with the peak
memory it added (CUDA: the allocator's peak; CPU: the process's resident high-water mark, reset with
/proc/self/clear_refs before the measured pass). `reference` is what the trainer did before:
the head's logits for every token, float32, log_softmax, gather and entropy.

    python tools/bench_logprob.py --tokens 2048 --hidden 512 --vocab 32000

``--liger`` adds the log-prob alone (no entropy), fused here and by Liger-kernel's fused linear
cross-entropy (``reduction="none"``; CUDA only, the ``liger-kernel`` package).

Ends with ``RESULT fused_vs_reference_time=... fused_vs_reference_memory=... fused_peak_mib=...
reference_peak_mib=...`` (and with ``--liger``: ``liger_vs_fused_log_prob_time=...
liger_vs_fused_log_prob_memory=...``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from psrl.rl.losses import entropy_from_logits
from psrl.trainer.logprob import fused_log_probs


def step(variant: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> None:
    if variant in LOG_PROB_ONLY:
        log_prob_only(variant, hidden, weight, targets).sum().backward()
        return
    if variant == "fused":
        log_probs, entropy = fused_log_probs(hidden, weight, targets, with_entropy=True)
        assert entropy is not None
    else:
        logits = (hidden @ weight.T).float()
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        entropy = entropy_from_logits(logits)
    (log_probs.sum() + 0.01 * entropy.sum()).backward()


LOG_PROB_ONLY = ("fused_log_prob", "liger")


def log_prob_only(variant: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The log-prob alone (no entropy): what Liger-kernel's fused linear cross-entropy computes."""
    if variant == "fused_log_prob":
        return fused_log_probs(hidden, weight, targets, with_entropy=False)[0]
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    nll: torch.Tensor = LigerFusedLinearCrossEntropyLoss(reduction="none")(weight, hidden, targets)
    return -nll


def resident_peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(args: argparse.Namespace) -> dict[str, float]:
    device = torch.device(args.device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype, requires_grad=True)
    weight = (0.02 * torch.randn(args.vocab, args.hidden, device=device, dtype=dtype)).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device)
    step(args.variant, hidden, weight, targets)  # warm-up
    times = []
    for _ in range(args.reps):
        hidden.grad = weight.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # reset the resident high-water mark
            base = resident_mib() * 2**20
        started = time.perf_counter()
        step(args.variant, hidden, weight, targets)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else resident_peak_mib() * 2**20
    return {"s": statistics.median(times), "peak_mib": (peak - base) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--liger",
        action="store_true",
        help="also the log-prob alone, fused here and by Liger-kernel (CUDA, liger-kernel installed)",
    )
    ap.add_argument("--variant", choices=["fused", "reference", *LOG_PROB_ONLY], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.liger and not str(args.device).startswith("cuda"):
        ap.error(f"--liger needs a CUDA device (Liger-kernel is Triton-only); got --device {args.device}")
    if args.variant:  # a child: one variant, its figures as JSON
        print(json.dumps(measure(args)))
        return
    results = {}
    for variant in ("reference", "fused", *(LOG_PROB_ONLY if args.liger else ())):
        command = [sys.executable, __file__, "--variant", variant, *sys.argv[1:]]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
        print(f"{variant}: {results[variant]['s']:.3f} s, +{results[variant]['peak_mib']:.0f} MiB", flush=True)
    fused, reference = results["fused"], results["reference"]
    liger = ""
    if args.liger:
        ours, theirs = results["fused_log_prob"], results["liger"]
        liger = (f" liger_vs_fused_log_prob_time={theirs['s'] / ours['s']:.2f}"
                 f" liger_vs_fused_log_prob_memory={theirs['peak_mib'] / max(ours['peak_mib'], 1e-9):.3f}")  # fmt: skip
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(f"RESULT tokens={args.tokens} vocab={args.vocab} logits_fp32_mib={logits_mib:.0f} "
          f"fused_vs_reference_time={fused['s'] / reference['s']:.2f} "
          f"fused_vs_reference_memory={fused['peak_mib'] / max(reference['peak_mib'], 1e-9):.3f} "
          f"fused_peak_mib={fused['peak_mib']:.0f} reference_peak_mib={reference['peak_mib']:.0f}{liger}")  # fmt: skip


if __name__ == "__main__":
    main()
