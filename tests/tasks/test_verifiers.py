"""verifiers environments as psrl tasks: the rows (first call) each example becomes, the gateway's
rendering of them, and scoring by the environment's own rollout and rubric on recorded model replies
(served over HTTP by a recorded transport: verifiers' real OpenAI client, environments and rubrics)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from psrl.tasks.verifiers_source import INSTALL

pytest.importorskip("verifiers", reason=f"needs the extra: {INSTALL}")
pytestmark = pytest.mark.verifiers

import openai  # noqa: E402
import verifiers as vf  # noqa: E402

from psrl.config import load_config  # noqa: E402
from psrl.gateway.agent_task import AgentTask  # noqa: E402
from psrl.preflight import checked  # noqa: E402
from psrl.tasks.verifiers_agent import VerifiersRolloutError, rollout  # noqa: E402
from psrl.tasks.verifiers_probe import MAX_CALLS, probe  # noqa: E402
from psrl.tasks.verifiers_source import AGENT_ENTRY, export_rows, load_env, source_problems  # noqa: E402

ENVS = Path(__file__).resolve().parents[2] / "examples" / "verifiers" / "sum_env.py"


def task(loader: str) -> str:
    return f"verifiers:{ENVS}:{loader}"


def reply(content: str = "", calls: list[tuple[str, dict[str, int]]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """A recorded chat completion: text, or tool calls."""
    tool_calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                  for i, (n, a) in enumerate(calls)]  # fmt: skip
    message = {"role": "assistant", "content": content or None, **({"tool_calls": tool_calls} if calls else {})}
    finish = "tool_calls" if calls else "stop"
    return {"id": "r", "object": "chat.completion", "created": 0, "model": "psrl",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}  # fmt: skip


class Recorded:
    """Answers each chat call with the next recorded response; keeps the calls' bodies."""

    def __init__(self, responses: list[httpx.Response]) -> None:
        self.responses, self.calls = list(responses), []  # type: list[httpx.Response], list[dict[str, Any]]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(json.loads(request.content))
        return self.responses.pop(0)


def run(row: dict[str, Any], *responses: httpx.Response) -> tuple[Any, Recorded]:
    recorded = Recorded(list(responses))

    async def go() -> Any:
        http = httpx.AsyncClient(transport=httpx.MockTransport(recorded))
        async with openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="k", http_client=http, max_retries=0) as c:
            return await rollout(c, row)

    try:
        return asyncio.run(go()), recorded
    except VerifiersRolloutError as exc:
        return exc, recorded


def ok(body: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json=body)


def first_row(loader: str, **kwargs: Any) -> dict[str, Any]:
    return export_rows(task(loader), kwargs, "psrl")[0]


def test_rows_are_the_environments_prompts_and_the_gateway_renders_them_with_the_chat_template(tmp_path: Path) -> None:
    name = task("load_single")
    env, rows = load_env(name, {"num_examples": 5}), export_rows(name, {"num_examples": 5}, "psrl")
    assert len(rows) == len(env.get_dataset()) == 5
    for row, example in zip(rows, env.get_dataset(), strict=True):
        assert row["messages"] == [{"role": "system", "content": "answer with the sum only"},
                                   {"role": "user", "content": example["question"]}]  # fmt: skip
        assert row["answer"] == example["answer"] and row["tools"] == []
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    agent_task = AgentTask.from_config(
        load_config(None, ["agent.entry=x:y", f"agent.dataset={dataset}", "env.enable=true"])
    )
    prompt = agent_task.prompt(0)
    assert prompt.text == f"system=answer with the sum only user={rows[0]['messages'][1]['content']} assistant="
    assert list(prompt.token_ids) == agent_task.codec.encode(prompt.text)


def test_a_tool_env_row_carries_the_tools_as_verifiers_client_sends_them() -> None:
    row = first_row("load_tool")
    [tool] = row["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == "add"
    assert tool["function"]["strict"] is True  # verifiers' own conversion, which a hand-written one missed
    assert tool["function"]["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(("answer_of", "score", "acc"), [(lambda a: a, 1.0, 1.0), (lambda a: a[0] + "9", 0.25, 0.0),
                                                         (lambda a: "none", 0.0, 0.0)])  # fmt: skip
def test_single_turn_scores_are_the_rubrics(answer_of: Callable[[str], str], score: float, acc: float) -> None:
    row = first_row("load_single")
    result, recorded = run(row, ok(reply(answer_of(row["answer"]))))
    assert result == {"score": score, "acc": acc}
    [call] = recorded.calls
    assert call["messages"] == row["messages"] and call["model"] == "psrl"


def test_a_multi_turn_env_answers_each_turn_and_scores_the_last() -> None:
    row = first_row("load_retry")
    wrong = str(int(row["answer"]) + 1)
    result, recorded = run(row, ok(reply(wrong)), ok(reply(row["answer"])))
    assert result == {"score": 1.0, "acc": 1.0}
    assert len(recorded.calls) == 2  # the right answer stopped it (the env's own stop condition)
    second = recorded.calls[1]["messages"]
    assert second[:2] == row["messages"]
    said = [{k: v for k, v in m.items() if v is not None} for m in second[2:]]
    assert said == [{"role": "assistant", "content": wrong}, {"role": "user", "content": "wrong try again"}]


def test_a_multi_turn_env_stops_at_its_max_turns() -> None:
    row = first_row("load_retry", max_turns=2)
    result, recorded = run(row, ok(reply("1")), ok(reply("2")))
    assert len(recorded.calls) == 2 and result["acc"] == 0.0


def test_a_tool_env_runs_the_tool_calls_and_the_rubric_scores_the_answer() -> None:
    row = first_row("load_tool", max_turns=4)
    question = [int(t) for t in row["messages"][-1]["content"].split()[1:]]
    first = question[0] + question[1]
    responses = [ok(reply(calls=[("add", {"a": question[0], "b": question[1]})])),
                 ok(reply(calls=[("add", {"a": first, "b": question[2]})])), ok(reply(row["answer"]))]  # fmt: skip
    result, recorded = run(row, *responses)
    assert result == {"score": 1.0, "acc": 1.0}
    assert len(recorded.calls) == 3
    tool_results = [m for m in recorded.calls[2]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_results] == [str(first), row["answer"]]
    assert all(call["tools"] == row["tools"] for call in recorded.calls)


@pytest.mark.parametrize(("loader", "named"), [("load_raising", "broken"), ("load_not_a_number", "wordy")])
def test_a_reward_function_that_raises_or_returns_a_non_number_fails_the_session(loader: str, named: str) -> None:
    result, _ = run(first_row(loader), ok(reply("70")))
    assert isinstance(result, VerifiersRolloutError)
    assert "the rubric of" in str(result) and f"reward function {named}" in str(result)


def test_a_refused_call_fails_the_session_but_psrls_turn_limit_ends_it_with_its_score() -> None:
    row = first_row("load_retry")
    ended = httpx.Response(409, json={"error": {"message": "session 3 ended: surplus", "type": "conflict",
                                                "param": None, "code": "session_ended"}})  # fmt: skip
    result, _ = run(row, ended)
    assert isinstance(result, VerifiersRolloutError) and "ConflictError" in str(result)
    limit = httpx.Response(409, json={"error": {"message": "session 3 used its env.max_turns=1 turns",
                                                "type": "conflict", "param": None, "code": "max_turns"}})  # fmt: skip
    result, recorded = run(row, ok(reply(row["answer"][0] + "9")), limit)
    assert not isinstance(result, Exception), result
    assert len(recorded.calls) == 2 and result["score"] == 0.25  # the rubric scored the turns it got


def test_an_empty_reply_is_the_models_and_keeps_the_rubrics_score() -> None:
    result, _ = run(first_row("load_single"), ok(reply("")))
    assert result == {"score": 0.0, "acc": 0.0}


def test_environments_that_cannot_train_are_refused_with_the_field_and_a_fix() -> None:
    [missing] = source_problems("verifiers:no_such_environment", {})
    assert missing.paths == ("task.name", "task.kwargs") and "does not load" in missing.message
    [bad_kwargs] = source_problems(task("load_single"), {"colour": "red"})
    assert "unexpected keyword argument 'colour'" in bad_kwargs.message and "task.kwargs" in bad_kwargs.fix
    [not_an_env] = source_problems(f"verifiers:{ENVS}:sums", {"num_examples": 2, "seed": 0})
    assert "not a verifiers.Environment" in not_an_env.message


@pytest.mark.parametrize(("loader", "named"), [("load_raising", "broken"), ("load_not_a_number", "wordy")])
def test_a_rubric_that_raises_or_returns_a_non_number_is_refused_before_launch(loader: str, named: str) -> None:
    [refused] = source_problems(task(loader), {})
    assert refused.paths == ("task.name",) and f"reward function {named}" in refused.message
    assert "reference answer" in refused.message and "return a number" in refused.fix


def test_the_probe_answers_with_the_reference_and_scores_like_the_run() -> None:
    for loader in ("load_single", "load_retry", "load_tool"):
        assert probe(first_row(loader)) == {"score": 1.0, "acc": 1.0}, loader


def test_the_probe_ends_an_environment_without_a_turn_limit(tmp_path: Path) -> None:
    module = tmp_path / "endless_env.py"
    module.write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "class Endless(vf.MultiTurnEnv):\n"
        "    async def env_response(self, messages, state, **kwargs):\n"
        "        return [{'role': 'user', 'content': 'more'}]\n"
        "def turns(state): return float(len(state['trajectory']))\n"
        "def load():\n"
        "    data = Dataset.from_list([{'question': 'sum 1 2', 'answer': '3'}])\n"
        "    return Endless(dataset=data, rubric=vf.Rubric(funcs=[turns]))\n"
    )
    assert probe(export_rows(f"verifiers:{module}:load", {}, "psrl")[0])["score"] == MAX_CALLS


def test_a_group_rubric_is_refused(tmp_path: Path) -> None:
    module = tmp_path / "group_env.py"
    module.write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "def rank(completions, answers): return [1.0 for _ in completions]\n"
        "def load():\n"
        "    data = Dataset.from_list([{'question': 'sum 1 2', 'answer': '3'}])\n"
        "    return vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[rank]))\n"
    )
    [group] = source_problems(f"verifiers:{module}:load", {})
    assert "group reward functions" in group.message


def test_checked_turns_a_verifiers_task_into_agent_sessions_over_its_rows(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PSRL_CACHE_DIR", str(tmp_path))
    config = checked(load_config("demo", [f"task.name={task('load_retry')}", "task.kwargs={num_examples: 6}",
                                          "env.enable=true"]))  # fmt: skip
    assert config.agent.entry == AGENT_ENTRY and config.env.enable
    rows = [json.loads(line) for line in Path(config.agent.dataset).read_text().splitlines()]
    assert [r["verifiers"]["example"] for r in rows] == list(range(6))
    assert Path(config.agent.dataset).parent == tmp_path / "verifiers"
    again = checked(config)  # a resolved config (a replay's, a resume's) is kept as it is
    assert again.agent.dataset == config.agent.dataset
    assert isinstance(load_env(task("load_retry"), {"num_examples": 6}), vf.MultiTurnEnv)


def test_loading_an_environment_keeps_the_process_signal_handlers() -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    load_env(task("load_single"), {"num_examples": 3, "seed": 7})  # verifiers installs its own while building
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
