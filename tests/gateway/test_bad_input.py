"""A seeded stream of bad requests against a live gateway: each gets OpenAI's error object with the
status a client expects (never a 5xx), is counted, and the sessions keep working meanwhile."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx

from psrl.gateway.local import EngineGateway
from tests.gateway.conftest import TOKEN

GOOD = {"model": "psrl", "messages": [{"role": "user", "content": "sum 1 2"}], "max_tokens": 2}
MUTATIONS: list[tuple[str, Any]] = [
    ("messages", None), ("messages", []), ("messages", "hi"), ("messages", [{"role": "robot", "content": "x"}]),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]), ("messages", [3]),
    ("n", 3), ("max_tokens", 0), ("max_tokens", "ten"), ("max_completion_tokens", -1), ("stop", 5),
    ("stop", ["a", "b", "c", "d", "e"]), ("temperature", 9), ("top_p", "x"), ("tool_choice", 7),
    ("tools", [{"type": "function"}]), ("tools", "all"), ("model", "gpt-9"),
    ("messages", [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]),
]  # fmt: skip


def bad_request(rng: random.Random, sid: str) -> tuple[str, str, bytes, dict[str, str], int]:
    """(method, path, body, headers, the status it must get)."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    path = f"/sessions/{sid}/v1/chat/completions"
    kind = rng.randrange(7)
    if kind == 0:  # a field gone wrong
        key, value = rng.choice(MUTATIONS)
        return "POST", path, json.dumps({**GOOD, key: value}).encode(), auth, 404 if value == "gpt-9" else 400
    if kind == 1:  # not JSON, or not an object
        return "POST", path, rng.choice([b"{", b"\xff\xfe", b"[1, 2]", b"null", b'"x"', b""]), auth, 400
    if kind == 2:
        return "POST", f"/sessions/nope-{rng.randrange(99)}/v1/chat/completions", json.dumps(GOOD).encode(), auth, 404
    if kind == 3:
        headers = rng.choice([{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
        return "POST", path, json.dumps(GOOD).encode(), headers, 401
    if kind == 4:
        return "POST", path, b" " * (1 << 20) + json.dumps(GOOD).encode(), auth, 413
    if kind == 5:
        return "GET", path, b"", auth, 405
    return "POST", f"/sessions/{sid}/v1/embeddings", json.dumps(GOOD).encode(), auth, 404


def test_bad_requests_get_openai_errors_and_nothing_else_breaks(gateway: EngineGateway) -> None:
    rng = random.Random(20261204)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        sid = http.post("/sessions", json={}, headers=auth).json()["id"]
        before = sum(gateway.http_settings.errors.values())
        for _ in range(300):
            method, path, body, headers, status = bad_request(rng, sid)
            answer = http.request(method, path, content=body, headers={**headers, "content-type": "application/json"})
            assert answer.status_code == status, (path, body[:80], answer.text[:200])
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        good = http.post(f"/sessions/{sid}/v1/chat/completions", json=GOOD, headers=auth)
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1
        assert sum(gateway.http_settings.errors.values()) == before + 300  # every one counted
