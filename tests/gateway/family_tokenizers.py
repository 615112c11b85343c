"""Small byte-level BPE tokenizers with each template family's special tokens, trained here in a
fraction of a second (no download): the TITO rules depend on the template and on byte-level BPE,
which Qwen, Llama 3 and SmolLM2 all use, not on the vocabulary's size."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = {
    "hermes": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
}
PLAIN_ADDED = {"hermes": ["<tool_call>", "</tool_call>"], "llama3": []}  # Qwen's are added, not special
STOP = {"hermes": "<|im_end|>", "llama3": "<|eot_id|>"}
CORPUS = [
    "You are a helpful assistant. What is the weather in Paris? The answer is 42.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} {"temperature": 21, "unit": "celsius"}',
    "Cutting Knowledge Date: December 2023 Environment: ipython system user assistant tool",
    "def add(a, b):\n    return a + b\n\n# Tools\n<tools></tools> <tool_response>\n</tool_response>",
]


@cache
def family_tokenizer(family: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL[family], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.add_tokens(PLAIN_ADDED[family])
    return tokenizer


def codec(family: str) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """encode (special tokens recognised, none added) and decode (special tokens kept)."""
    tokenizer = family_tokenizer(family)
    return (
        lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
    )


def stop_id(family: str) -> int:
    return int(family_tokenizer(family).token_to_id(STOP[family]))
