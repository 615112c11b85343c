"""Tool-call parsing against replies as the model families write them (Qwen2.5/Qwen3 hermes blocks,
Llama 3.x JSON), including the malformed ones a small model writes: those come back as content."""

from __future__ import annotations

import json

import pytest

from psrl.gateway.chat_templates import guess_family, load_template
from psrl.gateway.replies import make_reply
from psrl.gateway.tool_calls import parse, parser_for

QWEN_TWO_CALLS = (
    'I\'ll check both cities.\n<tool_call>\n{"name": "get_current_temperature", "arguments": '
    '{"location": "San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", '
    '"date": "2024-10-01", "unit": "celsius"}}\n</tool_call>'
)
LLAMA_CALL = '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}'


def test_qwen_hermes_blocks_become_tool_calls_and_the_rest_content() -> None:
    parsed = parse("hermes", QWEN_TWO_CALLS)
    assert parsed.content == "I'll check both cities."
    assert [c.name for c in parsed.tool_calls] == ["get_current_temperature", "get_temperature_date"]
    assert json.loads(parsed.tool_calls[1].arguments)["date"] == "2024-10-01"


def test_llama3_json_and_python_tag() -> None:
    for text in (
        LLAMA_CALL,
        "<|python_tag|>" + LLAMA_CALL,
        '{"name": "f", "arguments": {"x": 1}}; {"name": "g", "parameters": {}}',
    ):
        parsed = parse("llama3", text)
        assert parsed.tool_calls and not parsed.malformed and parsed.content == ""
    assert json.loads(parse("llama3", LLAMA_CALL).tool_calls[0].arguments)["unit"] == "Fahrenheit"
    assert parse("llama3", "The weather is fine.").tool_calls == ()


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>'),  # bad JSON
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off by max_tokens
        ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),  # no name
        ("hermes", '<tool_call>["get_weather"]</tool_call>'),
        ("llama3", '{"name": "get_weather", "parameters": "city=Paris"}'),
        ("llama3", '{"nam": "x"}'),
    ],
)
def test_a_malformed_call_is_returned_as_the_text_the_model_wrote(parser: str, text: str) -> None:
    parsed = parse(parser, text)
    assert parsed.content == text and parsed.tool_calls == () and parsed.malformed
    reply = make_reply(text, "stop", parser, [], "c")
    assert reply.message["content"] == text and "tool_calls" not in reply.message and reply.finish_reason == "stop"


def test_the_parser_follows_the_model_unless_overridden() -> None:
    assert load_template("psrl/assets/demo_model").family == "demo"
    assert parser_for("hermes") == "hermes" and parser_for("custom") == "none"
    assert parser_for("hermes", "llama3") == "llama3"
    assert guess_family("{{ '<|start_header_id|>' }}") == "llama3"


def test_stop_strings_cut_the_answer_and_tool_calls_finish_as_tool_calls() -> None:
    assert make_reply("one two three", "length", "none", ["two"], "c").message["content"] == "one "
    assert make_reply("one two three", "length", "none", ["two"], "c").finish_reason == "stop"
    reply = make_reply(QWEN_TWO_CALLS, "stop", "hermes", [], "call")
    assert reply.finish_reason == "tool_calls" and [c["id"] for c in reply.message["tool_calls"]] == [
        "call-0",
        "call-1",
    ]
