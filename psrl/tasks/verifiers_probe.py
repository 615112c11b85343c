"""Before launch: one rollout of a verifiers environment's first example, answered with its reference
answer, through the same agent a session runs (`psrl.tasks.verifiers_agent.rollout`).

The model's side of the conversation is played in-process (an httpx transport that answers each chat
call with the example's `answer`, no connection), so the environment's own turn loop and rubric run as
they will in the run. A reward function that raises or returns a non-number, or a reward that is not a
finite number, is then refused before anything starts instead of failing every session. The
transport answers at most `MAX_CALLS` calls, then refuses the next as the gateway does at
`env.max_turns`, so an environment without its own turn limit still ends.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

MAX_CALLS = 8


class _ReferenceAnswers:
    """Each chat call answered with `answer` as the assistant's text, until `MAX_CALLS`."""

    def __init__(self, answer: str) -> None:
        self.answer, self.calls = answer, 0

    def __call__(self, request: Any) -> Any:
        import httpx

        self.calls += 1
        if self.calls > MAX_CALLS:
            error = {"message": f"session probe used its env.max_turns={MAX_CALLS} turns", "type": "conflict",
                     "param": None, "code": "max_turns"}  # fmt: skip
            return httpx.Response(409, json={"error": error})
        message = {"role": "assistant", "content": self.answer or "0"}  # verifiers refuses an empty reply
        body = {"id": "probe", "object": "chat.completion", "created": 0, "model": json.loads(request.content)["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
        return httpx.Response(200, json=body)


def probe(row: dict[str, Any]) -> dict[str, float]:
    """The agent's result for `row` with its reference answer as every reply (raises as the agent would)."""
    import httpx
    import openai

    from psrl.tasks.verifiers_agent import rollout

    async def run() -> dict[str, float]:
        transport = httpx.MockTransport(_ReferenceAnswers(str(row.get("answer", ""))))
        http: Any = httpx.AsyncClient(transport=transport)  # openai 3 types its client as httpx2's; both work
        async with openai.AsyncOpenAI(base_url="http://probe/v1", api_key="probe", http_client=http,
                                      max_retries=0) as client:  # fmt: skip
            return await rollout(client, row)

    return asyncio.run(run())
