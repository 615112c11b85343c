"""Request/reply: correlation, timeouts, retries and at-most-once handling over real sockets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import zmq

from bus.errors import RequestTimeoutError
from bus.messages import PullRequest, WeightsLoaded
from bus.rpc import Replier, Request, Requester


class Server:
    """A Replier in its own thread answering PullRequest with WeightsLoaded via `answer`."""

    def __init__(self, ctx: zmq.Context, answer: Callable[[Replier, Request], None]) -> None:
        self.replier = Replier(ctx, "tcp://127.0.0.1:*", "ps.rep")
        self.answer = answer
        self.num_handled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            request = self.replier.recv(20)
            if request is not None:
                self.num_handled += 1
                self.answer(self.replier, request)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.replier.close()


def _echo(replier: Replier, request: Request) -> None:
    pull = request.event.message
    replier.reply(request, WeightsLoaded(pull.instance, pull.version, 1.5), model_version=pull.version)


@pytest.fixture
def echo_server(ctx: zmq.Context) -> Iterator[Server]:
    server = Server(ctx, _echo)
    yield server
    server.close()


def test_reply_is_correlated_with_its_request(ctx: zmq.Context, echo_server: Server) -> None:
    client = Requester(ctx, echo_server.replier.address, "rollout-0.req", timeout_ms=5000)
    for version in range(1, 20):
        reply = client.call(PullRequest("rollout-0", version), request_id=version)
        assert reply.message == WeightsLoaded("rollout-0", version, 1.5)
        assert reply.envelope.parent == f"rollout-0.req#0:{version}"
        assert reply.envelope.request_id == version and reply.envelope.model_version == version
    assert echo_server.num_handled == 19
    client.close()


def test_pipelined_requests_are_matched_by_parent(ctx: zmq.Context, echo_server: Server) -> None:
    client = Requester(ctx, echo_server.replier.address, "rollout-1.req")
    sent = [client.send(PullRequest("rollout-1", v)).event_id for v in range(50)]
    parents = set()
    for _ in sent:
        reply = client.recv_reply(None, 5000)
        assert reply is not None
        parents.add(reply.envelope.parent)
    assert parents == set(sent)
    client.close()


def test_no_server_times_out_after_every_retry(ctx: zmq.Context) -> None:
    client = Requester(ctx, "tcp://127.0.0.1:1", "lonely.req", timeout_ms=30, retries=2)
    with pytest.raises(RequestTimeoutError, match="after 3 attempt") as caught:
        client.call(PullRequest("i", 1))
    assert caught.value.num_attempts == 3
    client.close()


def test_retry_gets_the_late_reply_and_the_handler_runs_once(ctx: zmq.Context) -> None:
    replier = Replier(ctx, "tcp://127.0.0.1:*", "ps.rep")
    handled: list[Request] = []

    def serve() -> None:
        # Hold the first request unanswered until a retry of it has arrived, then answer it.
        while replier.num_duplicates == 0:
            request = replier.recv(20)
            if request is not None:
                handled.append(request)
        _echo(replier, handled[0])
        while replier.recv(300) is not None:  # later retries are answered from the cache
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    client = Requester(ctx, replier.address, "rollout-2.req", timeout_ms=100, retries=50)
    reply = client.call(PullRequest("rollout-2", 9))
    thread.join()
    assert reply.message.version == 9
    assert reply.envelope.parent == "rollout-2.req#0:1"
    assert len(handled) == 1
    client.close()
    replier.close()


def test_stale_replies_are_dropped(ctx: zmq.Context, echo_server: Server) -> None:
    client = Requester(ctx, echo_server.replier.address, "rollout-3.req")
    client.send(PullRequest("rollout-3", 1))  # its reply arrives while waiting for the next one
    reply = client.call(PullRequest("rollout-3", 2))
    assert reply.message.version == 2
    assert client.num_stale_replies == 1
    client.close()
