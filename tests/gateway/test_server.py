"""The gateway's HTTP server and its engine backends: connections without Nagle's delay, the token
checked before routing, and the engine in a process of its own answering like the threaded one."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from psrl.gateway.local import EngineGateway
from psrl.gateway.sessions import Settings
from tests.gateway.conftest import DEMO, TOKEN


def test_connections_are_accepted_with_tcp_nodelay(gateway: EngineGateway) -> None:
    # asyncio sets TCP_NODELAY only on sockets whose proto names TCP; without it every answer's body
    # waited behind its headers for the client's delayed ACK (40 ms a call)
    assert gateway.server.socket.proto == socket.IPPROTO_TCP
    client = socket.create_connection((gateway.server.host, gateway.server.port))
    try:
        client.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\nauthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        client.close()


def test_the_token_is_checked_before_routing(gateway: EngineGateway) -> None:
    assert httpx.get(f"{gateway.url}/nowhere").status_code == 401
    answer = httpx.get(f"{gateway.url}/nowhere", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"
    # a declared body over the limit is refused before a byte of it is read
    client = socket.create_connection((gateway.server.host, gateway.server.port))
    try:
        head = (
            f"POST /sessions HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {TOKEN}\r\ncontent-length: 99999999\r\n\r\n"
        )
        client.sendall(head.encode())
        assert client.recv(4096).startswith(b"HTTP/1.1 413")
    finally:
        client.close()


@pytest.mark.slow
def test_the_engine_in_a_process_of_its_own_answers_with_its_time() -> None:
    with EngineGateway(DEMO, settings=Settings(max_turn_tokens=4), engine_process=True, torch_threads=1) as gateway:
        sid = httpx.post(f"{gateway.url}/sessions", json={}).json()["id"]
        llm = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x", max_retries=0)
        raw = llm.chat.completions.with_raw_response.create(
            model="psrl", messages=[{"role": "user", "content": "sum 1 2"}], logprobs=True
        )
        answer = raw.parse()
        assert float(raw.headers["x-psrl-engine-ms"]) > 0
        [(prompt, output)] = gateway.generations
        [traj] = gateway.gateway.record(sid)["trajectories"]
        assert traj["token_ids"] == prompt + output  # the engine's tokens, across the pipe
        assert len(answer.choices[0].logprobs.content or []) == len(output) == answer.usage.completion_tokens
