"""CURVE: authorized clients talk; a client with another key pair, or the wrong server key, is refused,
on the proxies, on links and on the parameter server's bulk sockets alike."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import pytest
import zmq
from bus_helpers import recv_all
from click.testing import CliRunner
from zmq.utils.monitor import recv_monitor_message

from bus.addresses import plan_addresses
from bus.errors import BusError
from bus.link import Link
from bus.messages import Metrics, PullRequest, WeightsLoaded
from bus.proxy import BusProxy
from bus.publisher import Publisher
from bus.schema import Channel
from bus.security import CurveKeys, generate_keys, load_keys, start_authenticator
from bus.sockets import SocketOptions, bound_address
from bus.subscriber import Subscriber
from psrl.cli.keys_cmd import keys as keys_cli


@pytest.fixture
def keys(tmp_path: Path) -> CurveKeys:
    generate_keys(tmp_path / "keys")
    return load_keys(tmp_path / "keys")


@pytest.fixture
def stranger(tmp_path: Path, keys: CurveKeys) -> CurveKeys:
    """Valid CURVE keys that know the server's public key but were never authorized."""
    generate_keys(tmp_path / "other")
    other = load_keys(tmp_path / "other")
    return dataclasses.replace(keys, client=other.client)


def _handshake_result(socket: zmq.Socket, timeout_s: float = 10.0) -> int:
    """The first handshake outcome a socket's monitor reports (succeeded or a failure event)."""
    monitor = socket.get_monitor_socket()
    outcomes = {
        zmq.EVENT_HANDSHAKE_SUCCEEDED,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    }
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if monitor.poll(100):
                event = recv_monitor_message(monitor)["event"]
                if event in outcomes:
                    return event
        raise TimeoutError("no handshake outcome")
    finally:
        socket.disable_monitor()
        monitor.close(0)


def _link_recv(link: Link, timeout_ms: int) -> tuple[str, list] | None:
    return link.recv() if link.socket.poll(timeout_ms) else None


def test_an_authorized_link_peer_is_served_and_a_stranger_is_refused(
    ctx: zmq.Context, keys: CurveKeys, stranger: CurveKeys
) -> None:
    authenticator = start_authenticator(ctx, keys)
    server = Link(ctx, "tcp://127.0.0.1:*", sender="router", serve=True, options=SocketOptions(curve=keys))
    address = bound_address(server.socket)
    good = Link(ctx, address, sender="a", serve=False, identity="a", options=SocketOptions(curve=keys))
    good.send(PullRequest(instance="i0", version=3))
    received = _link_recv(server, 5000)
    assert received is not None and received[0] == "a"
    server.send(WeightsLoaded(instance="i0", version=3), "a")
    assert _link_recv(good, 5000) is not None

    bad = Link(ctx, address, sender="b", serve=False, identity="b", options=SocketOptions(curve=stranger))
    assert _handshake_result(bad.socket) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    with contextlib.suppress(zmq.Again):
        bad.socket.send_multipart([b"wt.pull", b"x"], zmq.NOBLOCK)
    assert _link_recv(server, 300) is None  # nothing of the stranger's reached the server
    for closable in (good, bad, server):
        closable.close()
    authenticator.stop()


def test_client_with_wrong_server_key_cannot_complete_the_handshake(
    ctx: zmq.Context, keys: CurveKeys, tmp_path: Path
) -> None:
    generate_keys(tmp_path / "fake")
    wrong_server = dataclasses.replace(keys, server=load_keys(tmp_path / "fake").server)
    authenticator = start_authenticator(ctx, keys)
    server = Link(ctx, "tcp://127.0.0.1:*", sender="router", serve=True, options=SocketOptions(curve=keys))
    client = Link(
        ctx,
        bound_address(server.socket),
        sender="c",
        serve=False,
        identity="c",
        options=SocketOptions(curve=wrong_server),
    )
    assert _handshake_result(client.socket) != zmq.EVENT_HANDSHAKE_SUCCEEDED
    client.close()
    server.close()
    authenticator.stop()


def test_proxy_with_curve_carries_events_of_authorized_actors_only(
    ctx: zmq.Context, keys: CurveKeys, stranger: CurveKeys, tmp_path: Path
) -> None:
    plan = plan_addresses(tmp_path, "tcp", curve_dir=str(tmp_path / "keys"))
    proxy = BusProxy(plan, ctx=ctx)  # loads the keys from curve_dir and starts the authenticator
    addresses = proxy.start()
    options = SocketOptions(curve=keys)
    sub = Subscriber(ctx, addresses.events_out, options=options)
    intruder = Subscriber(ctx, addresses.events_out, options=SocketOptions(curve=stranger))
    assert _handshake_result(intruder.socket) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    publisher = Publisher(ctx, addresses, "trainer", options=options)
    assert publisher.wait_subscribed(10, (Channel.EVENTS,))
    publisher.publish(Metrics(1, {"loss": 0.25}))
    (event,) = recv_all(sub, 1)
    assert event.message.values == {"loss": 0.25}
    assert intruder.recv(200) is None
    for closable in (publisher, sub, intruder):
        closable.close()
    proxy.stop()


def test_keys_cli_writes_private_secrets_and_refuses_to_overwrite(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(keys_cli, ["generate", str(tmp_path / "k")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "k" / "server.key_secret").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "k" / "authorized" / "client.key").is_file()
    again = runner.invoke(keys_cli, ["generate", str(tmp_path / "k")])
    assert again.exit_code == 1 and "already exists" in again.output
    alice = runner.invoke(keys_cli, ["generate", str(tmp_path / "k"), "--client", "alice"])
    assert alice.exit_code == 0 and (tmp_path / "k" / "authorized" / "alice.key").is_file()
    assert load_keys(tmp_path / "k", "alice").client != load_keys(tmp_path / "k").client


def test_missing_key_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(BusError, match=r"server\.key_secret is missing"):
        load_keys(tmp_path)


def test_an_actors_boot_keys_load_into_memory_and_leave_no_files(
    ctx: zmq.Context, keys: CurveKeys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor's private copy of the run's keys (secret keys included) is gone once they load."""
    from actors.boot import Boot, read_curve_files

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    boot = Boot("rollout-0", "rollout", 0, 0, "", {}, curve_files=read_curve_files(keys.source))
    loaded = boot.curve_keys()
    assert loaded is not None and list(scratch.iterdir()) == []
    assert loaded.server == keys.server and loaded.authorized == keys.authorized
    start_authenticator(ctx, loaded).stop()  # the authorized keys need no directory any more


def test_binding_without_authorized_keys_is_refused_with_the_directory_named(ctx: zmq.Context, keys: CurveKeys) -> None:
    with pytest.raises(BusError, match=r"authorized is missing"):
        start_authenticator(ctx, dataclasses.replace(keys, authorized=None))
