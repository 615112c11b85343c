"""A dataset of prompts as a task: row order, prompt rendering and tokenization.

`prompt(index)` is a pure function of (data settings, index), like a generator task's, so the
coordinator's cursor stays an int and a resumed run continues where it stopped: index `i` is row
`order(epoch)[i % len]` of epoch `i // len`, each epoch in a fresh seeded order (or in file order
with `data.shuffle=False`).

A prompt column holds a string (tokenized as it is, or wrapped in a user message with
`data.apply_chat_template`) or a list of chat messages, which the tokenizer's chat template
renders with the generation prompt appended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psrl.config.data import Data
from psrl.data.files import DataError, read_table
from psrl.tasks.base import Prompt, Reward


@dataclass
class RenderSettings:
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    apply_chat_template: bool = False
    system_prompt: str | None = None
    max_prompt_length: int = 1 << 30
    truncation: str = "left"  # left | right

    @classmethod
    def from_config(cls, data: Data, max_prompt_length: int) -> RenderSettings:
        return cls(data.prompt_key, data.answer_key, data.apply_chat_template, data.system_prompt,
                   max_prompt_length, data.truncation)  # fmt: skip


@dataclass
class PromptDataset:
    """Rows of one split (train or val) rendered into prompts for a tokenizer."""

    name: str
    table: Any  # datasets.Dataset
    tokenizer: Any
    settings: RenderSettings
    shuffle: bool = False
    seed: int = 0
    num_truncated: int = 0
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.table)

    def row_index(self, index: int) -> int:
        """The table row behind prompt `index` (epochs wrap around the table)."""
        epoch, position = divmod(index, len(self))
        if not self.shuffle:
            return position
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self))
            self._orders = {epoch: order}  # one epoch at a time: the cursor only moves forward
        return int(order[position])

    def prompt(self, index: int) -> Prompt:
        row = dict(self.table[self.row_index(index)])
        text, token_ids = self.render(row)
        answer = row.get(self.settings.answer_key)
        return Prompt(index, self.name, text, "" if answer is None else str(answer), tuple(token_ids), row)

    def reward(self, prompt: Prompt, response: str) -> Reward:
        raise DataError("a dataset has no reward of its own; set reward.function")

    def render(self, row: dict[str, Any]) -> tuple[str, list[int]]:
        """(prompt text, token ids) of one row; raises DataError naming the problem."""
        key = self.settings.prompt_key
        if key not in row:
            raise DataError(f"{self.name}: a row has no {key!r} column (columns: {sorted(row)}); set data.prompt_key")
        text, token_ids = render_prompt(row[key], self.tokenizer, self.settings)
        limit = self.settings.max_prompt_length
        if len(token_ids) > limit:
            self.num_truncated += 1
            token_ids = token_ids[-limit:] if self.settings.truncation == "left" else token_ids[:limit]
        return text, token_ids


def render_prompt(value: Any, tokenizer: Any, settings: RenderSettings) -> tuple[str, list[int]]:
    if isinstance(value, str) and not settings.apply_chat_template:
        return value, list(tokenizer.encode(value))
    messages = _messages(value, settings)
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "chat messages need a tokenizer with a chat template, and this one has none; "
            "use string prompts (and data.apply_chat_template=False) or a chat model's tokenizer"
        )
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # the template writes the special tokens (BOS, role markers) itself
    return str(text), list(tokenizer.encode(text, add_special_tokens=False))


def _messages(value: Any, settings: RenderSettings) -> list[dict[str, str]]:
    if isinstance(value, str):
        messages = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value and all(_is_message(m) for m in value):
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    else:
        raise DataError(
            f"a prompt must be a string or a list of {{role, content}} messages, got {type(value).__name__}: "
            f"{str(value)[:80]}"
        )
    if settings.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": settings.system_prompt})
    return messages


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and "role" in value and "content" in value


def load_split(data: Data, split: str, tokenizer: Any, max_prompt_length: int) -> PromptDataset | None:
    """The train or val split of `data` (None when it has no files)."""
    files = {"train": data.train_files, "val": data.val_files}[split]
    if not files:
        return None
    settings = RenderSettings.from_config(data, max_prompt_length)
    return PromptDataset(split, read_table(files), tokenizer, settings, shuffle=data.shuffle and split == "train",
                         seed=data.seed)  # fmt: skip
