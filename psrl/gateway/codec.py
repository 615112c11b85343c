"""The model's tokenizer as the gateway uses it: encode with special tokens recognised and none
added; decode keeping special tokens (TITO compares the model's context) or dropping them (what a
client reads). Its ``tokenizer.json`` through ``tokenizers`` when there is one, else transformers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psrl.gateway.tito import Decode, Encode


@dataclass(frozen=True)
class Codec:
    encode: Encode
    decode: Decode  # special tokens kept
    text: Decode  # special tokens dropped

    def stop_ids(self, close: str, eos: str) -> list[int]:
        """The tokens that end a turn: the end-of-sequence token and the first token of the template's close."""
        ids = {self.encode(eos)[0]} if eos and len(self.encode(eos)) == 1 else set()
        if close.strip():
            ids.add(self.encode(close)[0])
        return sorted(ids)


def load_codec(model_dir: str) -> Codec:
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path))
        return Codec(
            lambda s: fast.encode(s, add_special_tokens=False).ids,
            lambda ids: fast.decode(ids, skip_special_tokens=False),
            lambda ids: fast.decode(ids, skip_special_tokens=True),
        )
    from transformers import AutoTokenizer

    slow: Any = AutoTokenizer.from_pretrained(model_dir)
    return Codec(
        lambda s: list(slow.encode(s, add_special_tokens=False)),
        lambda ids: str(slow.decode(ids, skip_special_tokens=False)),
        lambda ids: str(slow.decode(ids, skip_special_tokens=True)),
    )
