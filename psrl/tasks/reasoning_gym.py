"""reasoning-gym as a task source: `task.name=reasoning_gym:<dataset>` with `task.kwargs`.

The library (the `reasoning-gym` extra) generates procedural problems with answers and scores
answers with each dataset's own `score_answer`, which is the reward here. `task.kwargs` holds the
dataset's config (the fields of its config dataclass) and `size`, the number of distinct training
problems (prompt index `i` is problem `i % size`). `reasoning_gym:composite` mixes datasets:
`task.kwargs.datasets` is a list of `{name, weight, config}`.

Held-out split by seed: the evaluation problems come from the same dataset config at a fixed
seed (`HELD_OUT_SEED`, the same for every training seed, so runs are compared on the same
questions), and a training problem whose question is also a held-out question is replaced by the
problem one `size` further on, so nothing evaluated is trained on.

Prompts are rendered with the tokenizer's chat template when it has one (system prompt, then the
question as the user's message), else as plain text. The answer scored is the text inside
`<answer>...</answer>` (the library's convention, which its default system prompt asks for), or the
whole response with `task.answer_tag=null`.
"""

from __future__ import annotations

import difflib
import numbers
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from psrl.errors import ConfigError, ConfigProblem
from psrl.tasks.base import Prompt, Reward

PREFIX = "reasoning_gym:"
MODULE = "reasoning_gym"
INSTALL = "pip install -c constraints.txt -e '.[reasoning-gym]'"
HELD_OUT_SEED = 1_000_003
DEFAULT_SIZE = 10_000
MAX_REDRAWS = 64  # a training problem equal to a held-out one is redrawn this many times at most
_CACHED_ENTRIES = 4096  # entries kept for scoring (a prompt is scored shortly after it is drawn)


class ScoreTypeError(TypeError):
    """A dataset's scorer returned something other than a number."""


def is_reasoning_gym(task_name: str) -> bool:
    return task_name.startswith(PREFIX)


def dataset_name(task_name: str) -> str:
    return task_name[len(PREFIX) :]


@dataclass(frozen=True)
class SourceSpec:
    """What `create_dataset` is called with, less the seed: the dataset, its size and its config."""

    name: str
    size: int
    config: dict[str, Any]

    @classmethod
    def parse(cls, task_name: str, kwargs: dict[str, Any]) -> SourceSpec:
        config = dict(kwargs)
        size = config.pop("size", DEFAULT_SIZE)
        config.pop("seed", None)  # the seed is task.seed (training) or HELD_OUT_SEED (evaluation)
        return cls(dataset_name(task_name), size, config)

    def create_kwargs(self, seed: int, size: int) -> dict[str, Any]:
        """Keyword arguments of `reasoning_gym.create_dataset` (composite specs become DatasetSpec objects)."""
        config: dict[str, Any] = {**self.config, "seed": seed, "size": size}
        if self.name == "composite":
            from reasoning_gym.composite import DatasetSpec

            config["datasets"] = [DatasetSpec(**_spec_fields(d)) for d in config.get("datasets") or []]
        return config


def _spec_fields(entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict) or "name" not in entry:
        raise ValueError(f"each entry of datasets must be {{name, weight, config}}, got {entry!r}")
    return {"name": entry["name"], "weight": entry.get("weight", 1.0), "config": dict(entry.get("config") or {})}


def source_problems(task_name: str, kwargs: dict[str, Any]) -> Iterator[ConfigProblem]:
    """Why `task_name` with `kwargs` cannot be loaded (the extra missing, an unknown dataset, bad kwargs)."""
    import importlib.util

    if importlib.util.find_spec(MODULE) is None:
        yield ConfigProblem(("task.name",), repr(task_name), "needs the optional package 'reasoning_gym' "
                            "(the reasoning-gym extra), which is not installed", INSTALL)  # fmt: skip
        return
    from reasoning_gym.factory import DATASETS

    spec = SourceSpec.parse(task_name, kwargs)
    names = [spec.name] + [str(d.get("name")) for d in spec.config.get("datasets") or [] if isinstance(d, dict)]
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        yield ConfigProblem(("task.name",), repr(task_name), f"unknown reasoning-gym dataset {unknown[0]!r}",
                            _known_names_fix(unknown[0], sorted(DATASETS)))  # fmt: skip
        return
    try:
        _create(spec, seed=0, size=1)[0]
    except Exception as exc:  # the config dataclasses raise TypeError, ValueError or AssertionError
        yield ConfigProblem(("task.kwargs",), repr(kwargs), f"{spec.name} refuses this config "
                            f"({type(exc).__name__}: {exc})", _config_fix(spec.name))  # fmt: skip


def _known_names_fix(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    listing = "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'"
    return f"{hint}use one of reasoning-gym's {len(known)} datasets ({listing})"


def _config_fix(name: str) -> str:
    if name == "composite":
        return "give task.kwargs.datasets as a list of {name, weight, config} (and an optional size)"
    from reasoning_gym.factory import DATASETS

    fields = sorted(getattr(DATASETS[name][1], "__dataclass_fields__", {}))
    return f"use only the fields of {DATASETS[name][1].__name__} ({', '.join(fields)}) with valid values"


def _create(spec: SourceSpec, seed: int, size: int) -> Any:
    from reasoning_gym import create_dataset

    return create_dataset(spec.name, **spec.create_kwargs(seed, size))


def render(
    question: str, tokenizer: Any, system_prompt: str | None, response_prefix: str = ""
) -> tuple[str, list[int]]:
    """(text, token ids) of a question: the chat template's rendering when the tokenizer has one, then the
    start of the answer the model continues from."""
    if getattr(tokenizer, "chat_template", None):
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages = [*system, {"role": "user", "content": question}]
        text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        text += response_prefix
        return text, list(tokenizer.encode(text, add_special_tokens=False))  # the template wrote the specials
    text = f"{system_prompt}\n\n{question}\n" if system_prompt else f"{question}\n"
    text += response_prefix
    return text, list(tokenizer.encode(text))


def extract_answer(response: str, tag: str | None) -> str | None:
    """The answer part of a response (None when the tag is missing: the scorer gives no credit)."""
    if tag is None:
        return response.strip()
    from reasoning_gym.utils import extract_answer as library_extract

    return library_extract(response, tag_name=tag)  # type: ignore[no-any-return]


def closed(text: str, tag: str | None) -> str:
    """`text` with its last <tag> closed: a response that opened the tag (or was prefixed with it) and then
    ended (at end-of-sequence or at task.max_response_length) has given all of its answer."""
    if tag is None or text.rfind(f"<{tag}>") <= text.rfind(f"</{tag}>"):
        return text
    return f"{text}</{tag}>"


def checked_score(task_name: str, value: Any) -> float:
    """A scorer's return value as a float, or ScoreTypeError naming the task."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ScoreTypeError(f"task {task_name!r}: score_answer returned {type(value).__name__} {value!r}, "
                             "not a number")  # fmt: skip
    return float(value)


def default_system_prompt(answer_tag: str | None) -> str | None:
    """reasoning-gym's own default instructions when answers are read from <answer> tags."""
    if answer_tag != "answer":
        return None
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return str(SYSTEM_PROMPTS["default"])


@dataclass
class ReasoningGymTask:
    """A reasoning-gym dataset (train split at `seed`, held-out split at HELD_OUT_SEED) as a psrl task."""

    name: str
    spec: SourceSpec
    tokenizer: Any
    seed: int = 0
    system_prompt: str | None = None
    answer_tag: str | None = "answer"
    response_prefix: str = ""
    eval_size: int = 64
    split: Literal["train", "val"] = "train"
    _datasets: dict[str, Any] = field(default_factory=dict, repr=False)
    _entries: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    # prompts are drawn by the coordinator while responses may be scored on reward threads
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _held_out_questions: frozenset[str] | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> ReasoningGymTask:
        spec = SourceSpec.parse(config.task.name, config.task.kwargs)
        problems = list(source_problems(config.task.name, config.task.kwargs))
        if problems:
            raise ConfigError(problems)
        tag = config.task.answer_tag
        system = config.data.system_prompt if config.data.system_prompt is not None else default_system_prompt(tag)
        return cls(config.task.name, spec, tokenizer, seed=config.task.seed, system_prompt=system, answer_tag=tag,
                   response_prefix=config.task.response_prefix, eval_size=config.eval.num_prompts)  # fmt: skip

    def held_out(self) -> ReasoningGymTask:
        return replace(self, split="val", _datasets={}, _entries={}, _lock=threading.Lock(), _held_out_questions=None)

    def prompt(self, index: int) -> Prompt:
        position, entry = self._entry(index)
        text, token_ids = render(str(entry["question"]), self.tokenizer, self.system_prompt, self.response_prefix)
        kind = str(entry.get("metadata", {}).get("source_dataset", self.spec.name))
        row = {"question": str(entry["question"]), "answer": str(entry["answer"]), "position": position}
        return Prompt(index, kind, text, str(entry["answer"]), tuple(token_ids), row)

    def reward(self, prompt: Prompt, response: str) -> Reward:
        with self._lock:
            cached = self._entries.get(prompt.index)
        entry = cached or self._entry(prompt.index)[1]
        answer = extract_answer(closed(self.response_prefix + response, self.answer_tag), self.answer_tag)
        score = checked_score(self.name, self._dataset().score_answer(answer, entry))
        return Reward(score=score, acc=1.0 if score >= 1.0 else 0.0)

    def _dataset(self) -> Any:
        if "main" not in self._datasets:
            seed, size = (self.seed, self.spec.size) if self.split == "train" else (HELD_OUT_SEED, self.eval_size)
            self._datasets["main"] = _create(self.spec, seed, size)
        return self._datasets["main"]

    def _entry(self, index: int) -> tuple[int, dict[str, Any]]:
        """(problem position, entry) of prompt `index`: held-out problems are never drawn for training."""
        dataset = self._dataset()
        if self.split == "val":
            position = index % self.eval_size
            return self._remember(index, position, dataset[position])
        held_out = self._held_out()
        position = index % self.spec.size
        for _ in range(MAX_REDRAWS):
            entry = dataset[position]
            if str(entry["question"]) not in held_out:
                return self._remember(index, position, entry)
            position += self.spec.size
        problem = ConfigProblem(("task.kwargs",), repr(self.spec.config), "almost every training problem is also "
                                "a held-out one", "make the dataset's problem space larger")  # fmt: skip
        raise ConfigError([problem])

    def _remember(self, index: int, position: int, entry: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if len(self._entries) >= _CACHED_ENTRIES:
                self._entries.pop(next(iter(self._entries)))  # oldest first: prompts are drawn in index order
            self._entries[index] = entry
        return position, entry

    def _held_out(self) -> frozenset[str]:
        if self._held_out_questions is None:
            held_out = _create(self.spec, HELD_OUT_SEED, self.eval_size)
            self._held_out_questions = frozenset(str(held_out[i]["question"]) for i in range(self.eval_size))
        return self._held_out_questions
