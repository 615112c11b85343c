"""A rollout instance process serving a router link: streaming, abort, pause/resume, status."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from actors.boot import Boot
from bus import BusProxy, Link, Publisher, Subscriber
from bus.addresses import plan_addresses
from bus.messages import (
    Abort,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InstanceStatus,
    Pause,
    RequestSampling,
    Resume,
    Shutdown,
    TokenBatch,
)
from launch.plan import ActorSpec
from launch.process import start_actor
from psrl.config import load_config, to_yaml

pytestmark = pytest.mark.system
STARTUP_MS = 240_000  # an instance is up once it reports; vLLM's import alone takes up to a minute on 2 busy cores


BACKENDS = {"embedded": [], "vllm": ["engine.backend=vllm", "engine.block_size=32"]}


@pytest.fixture(params=["embedded", pytest.param("vllm", marks=pytest.mark.vllm)])
def instance(request, tmp_path):
    # booted by hand: the transport is named, as the launcher resolves psrl.ps.transport=auto before any actor
    config = load_config("demo", ["engine.max_num_seqs=4", "psrl.ps.transport=zmq", *BACKENDS[request.param]])
    ctx = zmq.Context()
    proxy = BusProxy(plan_addresses(tmp_path), ctx=ctx)
    addresses = proxy.start()
    router_address = f"ipc://{tmp_path}/router.sock"
    link = Link(ctx, router_address, sender="router", serve=True)
    bus = {k: v for k, v in vars(addresses).items() if k != "curve_dir"}
    boot = Boot("rollout-0", "rollout", 0, 0, to_yaml(config), bus, {"router": router_address, "ps-0.1": "ipc:///x",
                "ps-1.1": "ipc:///y"}, run_dir=str(tmp_path))  # fmt: skip
    process = start_actor(ActorSpec("rollout-0", "rollout", 0, None), boot, tmp_path / "rollout.log")
    publisher = Publisher(ctx, addresses, "test")
    status = Subscriber(ctx, addresses.events_out, ["inst.status"])
    yield link, publisher, status, process
    publisher.publish(Shutdown())
    process.wait(15)
    process.close_stdin()
    process.log.close()
    for closeable in (link, publisher, status):
        closeable.close()
    proxy.stop()
    ctx.destroy(linger=0)


def send(link: Link, message, timeout_s: float = 30) -> None:
    """Send to the instance, waiting until its link has connected (a status can come first)."""
    deadline = time.monotonic() + timeout_s
    while link.send(message, "rollout-0") is None:
        assert time.monotonic() < deadline, "the instance never connected to the router link"
        time.sleep(0.05)


def receive(link: Link, kinds: tuple[type, ...], timeout_s: float = 60) -> list:
    deadline, out = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        got = link.recv()
        if got is None:
            time.sleep(0.01)
            continue
        out += [e.message for e in got[1] if isinstance(e.message, kinds)]
        if any(isinstance(m, GenerateResult) for m in out):
            return out
    return out


def drain(link: Link, seconds: float, kinds: tuple[type, ...]) -> list:
    deadline, out = time.monotonic() + seconds, []
    while time.monotonic() < deadline:
        got = link.recv()
        if got is None:
            time.sleep(0.01)
        else:
            out += [e.message for e in got[1] if isinstance(e.message, kinds)]
    return out


def receive_first(link: Link, kind: type, timeout_s: float = 30) -> object | None:
    """The first message of `kind` (others are dropped), or None when none comes in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = link.recv()
        if got is None:
            time.sleep(0.001)
            continue
        for event in got[1]:
            if isinstance(event.message, kind):
                return event.message
    return None


def request(rid: int, length: int) -> GenerateRequest:
    params = RequestSampling(length, 1.0, seed=rid, min_tokens=length, ignore_eos=True)
    return GenerateRequest(rid, 0, np.asarray([5, 6, 7, 8], np.int32), params)


def test_streams_tokens_then_a_complete_result(instance) -> None:
    link, _, status, _ = instance
    assert status.recv(STARTUP_MS) is not None  # the instance is up and reporting
    send(link, request(1, 40))
    messages = receive(link, (TokenBatch, GenerateResult))
    chunks = [m for m in messages if isinstance(m, TokenBatch)]
    result = next(m for m in messages if isinstance(m, GenerateResult))
    assert result.finish_reason == FinishReason.LENGTH and len(result.token_ids) == 40
    streamed = np.concatenate([c.token_ids for c in chunks]).tolist()
    assert chunks and streamed == result.token_ids[: len(streamed)].tolist()
    assert (result.versions == 0).all() and len(result.logprobs) == 40


def test_abort_returns_the_tokens_so_far_and_pause_stops_progress(instance) -> None:
    link, publisher, status, _ = instance
    assert status.recv(STARTUP_MS) is not None
    publisher.publish(Pause(targets=["rollout-0"]))
    time.sleep(0.5)
    send(link, request(2, 500))
    assert not drain(link, 1.0, (TokenBatch, GenerateResult)), "a paused instance generated tokens"
    publisher.publish(Resume(targets=["rollout-0"]))
    first = receive_first(link, TokenBatch)
    # pause at once: 500 tokens at batch 1 take well under a second, so an abort sent while the
    # instance still generates could find the request already finished
    publisher.publish(Pause(targets=["rollout-0"]))
    assert first is not None, "no tokens after resuming"
    time.sleep(0.3)
    send(link, Abort([2], "requested"))
    result = next(m for m in receive(link, (GenerateResult,)) if isinstance(m, GenerateResult))
    assert result.finish_reason == FinishReason.ABORT and result.error == "requested"
    assert 0 < len(result.token_ids) < 500


def test_bad_request_gets_a_request_scoped_error(instance) -> None:
    link, _, status, _ = instance
    assert status.recv(STARTUP_MS) is not None
    bad = GenerateRequest(3, 0, np.asarray([], np.int32), RequestSampling(8))
    send(link, bad)
    result = next(m for m in receive(link, (GenerateResult,)) if isinstance(m, GenerateResult))
    assert result.finish_reason == FinishReason.ERROR and result.error
    send(link, request(4, 8))  # and it keeps serving
    result = next(m for m in receive(link, (GenerateResult,)) if isinstance(m, GenerateResult))
    assert result.request_id == 4 and len(result.token_ids) == 8
    snapshot = status.recv(5_000)
    assert isinstance(snapshot.message, InstanceStatus)
