"""The gateway fuzzer's requests and its raw HTTP client (`tools/fuzz_gateway.py`), against the
in-process gateway: every kind of bad request, each answered with its status and OpenAI's error
object, disconnects mid-body and mid-stream, and the gateway answering after them."""

from __future__ import annotations

import asyncio

import pytest

from psrl.gateway.local import EngineGateway
from tests.gateway.conftest import TOKEN
from tools import fuzz_gateway


def test_the_fuzzer_s_bad_requests_each_get_their_error(
    gateway: EngineGateway, capfd: pytest.CaptureFixture[str]
) -> None:
    shots = fuzz_gateway.shots(7, 400, gateway.http_settings.max_body_bytes, range(9000, 9010), token=TOKEN)
    assert {s.kind for s in shots} == set(fuzz_gateway.KINDS)
    assert fuzz_gateway.shots(7, 400, 1 << 20, range(9000, 9010), token=TOKEN) == fuzz_gateway.shots(
        7, 400, 1 << 20, range(9000, 9010), token=TOKEN
    )  # seeded
    before = sum(gateway.http_settings.errors.values())
    tally = asyncio.run(fuzz_gateway.send_all(gateway.url, shots, concurrency=8, token=TOKEN))
    assert tally.num_unexpected == 0, tally.unexpected
    assert tally.bad_bodies == 0 and tally.healthy_after
    answered = sum(tally.statuses.values())
    assert answered == 400 - tally.sent["disconnect"] and tally.sent["disconnect"] > 0
    # each one counted; so is a disconnect whose request was whole (answered to no one) or cut (400)
    counted = sum(gateway.http_settings.errors.values()) - before
    assert answered < counted <= answered + tally.sent["disconnect"]
    assert "Exception in ASGI application" not in capfd.readouterr().err  # a cut body is an answered error
