"""When the coordinator evaluates, what it asks an instance for, and the metrics of a finished round.

A round evaluates one version on one instance: the first instance that reports holding a version
at or past the next one due (0, every ``trainer.eval_interval`` versions, and the last) gets every
held-out sample in one ``EvalRequest``. The instance answers at the weights it holds and keeps
them until the round's answers are done (it defers a sync; see ``InstanceFlow``), so every token of
a round comes from one version, which the metrics carry (``eval/version``). Evaluation requests never
pass the router: they hold no staleness slot and no ledger entry, and their answers go to no
buffer. An instance that disappears mid-round loses the round; the next due check starts it again.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bus.messages import EvalRequest, EvalResult, FinishReason, RequestSampling
from psrl.config import Config
from psrl.evaluation.passk import pass_at_k
from psrl.tasks.base import Prompt, Reward


class HeldOutSource(Protocol):
    """The held-out split and its reward (``psrl.flows.prompts.HeldOutPrompts``)."""

    stop_token_ids: list[int]

    def prompt(self, index: int) -> Prompt: ...

    def token_ids(self, prompt: Prompt) -> np.ndarray: ...

    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward: ...


@dataclass(frozen=True)
class EvalSample:
    prompt_index: int
    is_greedy: bool


@dataclass
class EvalRound:
    number: int
    instance: str
    version_asked: int
    started: float
    samples: list[EvalSample]
    results: dict[int, EvalResult] = field(default_factory=dict)

    @property
    def is_complete(self) -> bool:
        return len(self.results) == len(self.samples)


class EvalPlanner:
    def __init__(self, config: Config, source: HeldOutSource) -> None:
        self.interval = config.trainer.eval_interval
        self.last_version = config.trainer.total_steps
        self.settings = config.eval
        self.task = config.task
        self.source = source
        self.next_due = 0
        self.num_rounds = 0
        self.round: EvalRound | None = None
        self.evaluated: list[int] = []  # versions measured so far
        self.samples = self._samples()

    def _samples(self) -> list[EvalSample]:
        out = []
        for index in range(self.settings.num_prompts):
            if self.settings.greedy:
                out.append(EvalSample(index, True))
            out.extend(EvalSample(index, False) for _ in range(self.settings.k))
        return out

    # ------------------------------------------------------------------ when

    def is_due(self, version: int) -> bool:
        return self.round is None and self.next_due <= self.last_version and version >= self.next_due

    @property
    def is_last_measured(self) -> bool:
        """The last version has been evaluated (nothing more is due)."""
        return self.next_due > self.last_version

    def start(self, instance: str, version: int, now: float) -> EvalRequest:
        """A round on ``instance``, which holds ``version`` (>= the version due)."""
        self.num_rounds += 1
        self.round = EvalRound(self.num_rounds, instance, version, now, self.samples)
        prompts = [self.source.prompt(i) for i in range(self.settings.num_prompts)]
        ids = [self.source.token_ids(p) for p in prompts]
        sample_ids = list(range(len(self.samples)))
        return EvalRequest(
            instance=instance,
            round=self.num_rounds,
            version=version,
            sample_ids=sample_ids,
            prompt_lengths=np.asarray([len(ids[s.prompt_index]) for s in self.samples], np.int32),
            prompt_token_ids=np.concatenate([ids[s.prompt_index] for s in self.samples]).astype(np.int32),
            sampling=[self._sampling(self.num_rounds, i, s) for i, s in enumerate(self.samples)],
        )

    def _sampling(self, round_number: int, sample_id: int, sample: EvalSample) -> RequestSampling:
        task = self.task
        return RequestSampling(
            max_tokens=self.settings.max_tokens or task.max_response_length,
            temperature=0.0 if sample.is_greedy else task.temperature,
            top_p=1.0 if sample.is_greedy else task.top_p,
            top_k=-1 if sample.is_greedy else task.top_k,
            stop_token_ids=list(self.source.stop_token_ids),
            seed=(task.seed * 1_000_003 + round_number * 65_537 + sample_id) % (2**31),
        )

    def abandon(self, instance: str) -> bool:
        """``instance`` is gone: its round is lost (the next due check starts it again)."""
        if self.round is None or self.round.instance != instance:
            return False
        self.round = None
        return True

    # ------------------------------------------------------------------ results

    def record(self, result: EvalResult, now: float) -> dict[str, float] | None:
        """Take one answer; the round's metrics once it is complete, else None."""
        current = self.round
        if current is None or result.round != current.number or result.instance != current.instance:
            return None
        if not 0 <= result.sample_id < len(current.samples):
            return None
        current.results[result.sample_id] = result
        if not current.is_complete:
            return None
        self.round = None
        metrics = self._metrics(current, now)
        version = int(metrics["eval/version"])
        self.evaluated.append(version)
        self.next_due = self._after(version)
        return metrics

    def _after(self, version: int) -> int:
        """The next version due after evaluating ``version``: the next multiple of the interval, or the last."""
        following = (version // self.interval + 1) * self.interval
        if version < self.last_version:
            return min(following, self.last_version)
        return self.last_version + 1

    def _metrics(self, current: EvalRound, now: float) -> dict[str, float]:
        greedy: list[float] = []
        sampled: dict[int, list[float]] = defaultdict(list)  # prompt -> correctness of its sampled answers
        lengths, versions, num_errors = [], set(), 0
        for sample_id, sample in enumerate(current.samples):
            result = current.results[sample_id]
            is_correct = False
            if result.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                num_errors += 1
            else:
                reward = self.source.score(self.source.prompt(sample.prompt_index), np.asarray(result.token_ids))
                is_correct = _is_correct(reward)
                lengths.append(len(result.token_ids))
            if result.version >= 0:
                versions.add(result.version)
            (greedy if sample.is_greedy else sampled[sample.prompt_index]).append(float(is_correct))
        values = {
            "eval/version": float(max(versions) if versions else current.version_asked),
            "eval/mean_length": float(np.mean(lengths)) if lengths else 0.0,
            "eval/num_samples": float(len(current.samples)),
            "eval/num_errors": float(num_errors),
            "eval/mixed_versions": float(len(versions) > 1),
            "eval/duration_s": now - current.started,
        }
        return {**values, **self._accuracies(greedy, list(sampled.values()))}

    def _accuracies(self, greedy: list[float], sampled: list[list[float]]) -> dict[str, float]:
        """eval/acc (greedy, else the sampled answers'), eval/pass@k and eval/sampled_acc."""
        values = {}
        if greedy:
            values["eval/acc"] = float(np.mean(greedy))
        k = self.settings.k
        if k and sampled:
            values[f"eval/pass@{k}"] = float(np.mean([pass_at_k(k, int(sum(c)), k) for c in sampled]))
            values["eval/sampled_acc"] = float(np.mean([x for c in sampled for x in c]))
            values.setdefault("eval/acc", values["eval/sampled_acc"])
        return values


def _is_correct(reward: Reward) -> bool:
    """Exact-match accuracy when the reward reports one, else a full score."""
    return reward.acc >= 1.0 if not math.isnan(reward.acc) else reward.score >= 1.0
