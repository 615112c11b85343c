"""The model's chat template: which one a model uses, and rendering messages with it.

A template is the model's own (``chat_template`` in its tokenizer config or a ``chat_template.jinja``
beside it), or one of the bundled families by name (``hermes``: Qwen2.5/Qwen3-style ChatML with
``<tool_call>`` JSON; ``llama3``: Llama 3.x with JSON tool calls; ``demo``: psrl's demo model, whose
vocabulary is letters, digits, ``=`` and space), or a path to a ``.jinja`` file. Rendering uses
Jinja2's sandbox the way transformers does, so a template renders the same text here as there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

BUNDLED = Path(__file__).resolve().parent / "templates"
FAMILIES = ("hermes", "llama3", "demo")


class TemplateError(ValueError):
    """No usable chat template, or the template failed on these messages."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # the Jinja text
    family: str  # hermes, llama3, demo, or custom (a model's own template of no known family)
    bos_token: str = ""
    eos_token: str = ""

    @cached_property
    def _compiled(self) -> Any:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        loops = ["jinja2.ext.loopcontrols"]
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=loops)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        return env.from_string(self.source)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool) -> str:
        """The conversation as the model sees it (``generation``: followed by the assistant's header)."""
        try:
            return str(
                self._compiled.render(
                    messages=messages,
                    tools=tools or None,
                    add_generation_prompt=generation,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                )
            )
        except TemplateError:
            raise
        except Exception as exc:  # a template is data: any failure is a bad conversation for it, not a crash
            raise TemplateError(f"chat template ({self.family}) failed: {type(exc).__name__}: {exc}") from exc


def _tojson(value: Any, indent: int | None = None) -> str:
    # transformers' tojson: no HTML escaping, keys in the order given
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise TemplateError(message)


def bundled(family: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    if family not in FAMILIES:
        raise TemplateError(f"no bundled chat template {family!r} (known: {', '.join(FAMILIES)})")
    return ChatTemplate((BUNDLED / f"{family}.jinja").read_text(), family, bos_token, eos_token)


def load_template(model_dir: str, choice: str = "auto") -> ChatTemplate:
    """The template for the model in ``model_dir``: ``choice`` is auto, a family name or a .jinja path."""
    config = _tokenizer_config(model_dir)
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    if choice in FAMILIES:
        return bundled(choice, bos, eos)
    if choice != "auto":
        path = Path(choice)
        if not path.is_file():
            raise TemplateError(f"chat template {choice!r} is neither a family ({', '.join(FAMILIES)}) nor a file")
        return ChatTemplate(path.read_text(), guess_family(path.read_text()), bos, eos)
    source = _own_template(model_dir, config)
    if source:
        return ChatTemplate(source, guess_family(source), bos, eos)
    if _is_demo_model(model_dir):
        return bundled("demo", bos, eos)
    raise TemplateError(
        f"the model in {model_dir} has no chat template: set gateway.chat_template to "
        f"one of {', '.join(FAMILIES)} or a .jinja file"
    )


def guess_family(source: str) -> str:
    """The tool-call family a template's text belongs to (it decides the default tool-call parser)."""
    if "<tool_call>" in source:
        return "hermes"
    if "<|start_header_id|>" in source:
        return "llama3"
    return "custom"


def _tokenizer_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "tokenizer_config.json"
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def _own_template(model_dir: str, config: dict[str, Any]) -> str:
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    return source if isinstance(source, str) else ""


def _token_text(token: Any) -> str:
    if isinstance(token, dict):
        return str(token.get("content", ""))
    return token if isinstance(token, str) else ""


def _is_demo_model(model_dir: str) -> bool:
    # psrl.engine.args.DEMO_MODEL_DIR, without importing the engine (and torch) into the gateway
    return Path(model_dir).resolve() == (Path(__file__).resolve().parent.parent / "assets" / "demo_model")
