"""The run's XSUB/XPUB proxies: one for events, one for control, each forwarding in libzmq.

Forwarding runs in libzmq's C proxy (`zmq.proxy_steerable`), one thread per channel with the GIL
released, so the proxy adds no Python work per message. The XPUB side drops a message for a
subscriber whose queue is full (it never blocks), so one slow subscriber cannot stall the
publishers or the other subscribers.

Each proxy also hands a copy of every message to a capture socket read by the `Retainer`
(``bus/retainer.py``), when the plan names a ``catch_up`` address: a restarted event logger gets
back what it missed from there.

In-process use: ``with BusProxy(plan) as proxy: addresses = proxy.addresses``. As its own
process: ``python -m bus.proxy RUN_DIR [--transport tcp]`` binds, writes ``RUN_DIR/bus.json``
and forwards until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

import structlog
import zmq
from zmq.auth.thread import ThreadAuthenticator

from bus.addresses import BusAddresses, plan_addresses
from bus.errors import BusError
from bus.retainer import Retainer
from bus.security import load_keys, start_authenticator
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, bound_address, make_socket

_TERMINATE = b"TERMINATE"
CAPTURE_HWM = 100_000  # copies queued for the retainer; beyond it copies drop, the proxy never waits


@dataclass
class _Forwarder:
    thread: threading.Thread
    command: zmq.Socket[bytes]


class BusProxy:
    """Binds both proxy pairs and forwards in background threads until `stop`."""

    def __init__(
        self,
        plan: BusAddresses,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.plan = plan
        self.options = options
        self._ctx = ctx or zmq.Context.instance()
        self._forwarders: list[_Forwarder] = []
        self._retainer: Retainer | None = None
        self._authenticator: ThreadAuthenticator | None = None
        self.addresses: BusAddresses | None = None

    def start(self) -> BusAddresses:
        """Bind and start forwarding; returns the concrete addresses (tcp ports resolved)."""
        if self.addresses is not None:
            raise BusError("proxy already started")
        options = self.options
        if options.curve is None and self.plan.curve_dir is not None:
            options = replace(options, curve=load_keys(self.plan.curve_dir))
        if options.curve is not None:
            self._authenticator = start_authenticator(self._ctx, options.curve)
        try:
            if self.plan.catch_up is not None:
                self._retainer = Retainer(self._ctx, self.plan.catch_up, options)
            events_in, events_out = self._start_pair("events", self.plan.events_in, self.plan.events_out, options)
            control_in, control_out = self._start_pair("control", self.plan.control_in, self.plan.control_out, options)
        except BaseException:
            self.stop()
            raise
        catch_up = None
        if self._retainer is not None:
            self._retainer.start()
            catch_up = self._retainer.address
        self.addresses = BusAddresses(
            events_in, events_out, control_in, control_out, self.plan.curve_dir, catch_up=catch_up
        )
        return self.addresses

    def _start_pair(self, name: str, in_address: str, out_address: str, options: SocketOptions) -> tuple[str, str]:
        frontend = make_socket(self._ctx, zmq.XSUB, in_address, options=options)
        try:
            backend = make_socket(self._ctx, zmq.XPUB, out_address, options=options)
        except BusError:
            frontend.close(0)
            raise
        command_address = f"inproc://psrl-proxy-{name}-{uuid.uuid4().hex}"
        control = make_socket(self._ctx, zmq.PAIR, command_address)
        command = make_socket(self._ctx, zmq.PAIR, command_address, bind=False)
        capture = None
        if self._retainer is not None:
            # Publishers send only what someone subscribed to: while no logger is subscribed, its
            # kinds would never reach the proxy, so the proxy itself subscribes to everything.
            frontend.send(b"\x01")
            capture_address = f"inproc://psrl-capture-{name}-{uuid.uuid4().hex}"
            capture = self._ctx.socket(zmq.PUB)
            capture.setsockopt(zmq.SNDHWM, CAPTURE_HWM)
            capture.bind(capture_address)
            self._retainer.watch(capture_address)
        addresses = bound_address(frontend), bound_address(backend)
        thread = threading.Thread(
            target=_forward, args=(frontend, backend, control, capture), name=f"bus-proxy-{name}", daemon=True
        )
        thread.start()
        self._forwarders.append(_Forwarder(thread, command))
        return addresses

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop forwarding and close every socket (idempotent)."""
        for forwarder in self._forwarders:
            forwarder.command.send(_TERMINATE)
        for forwarder in self._forwarders:
            forwarder.thread.join(timeout_s)
            forwarder.command.close(0)
            if forwarder.thread.is_alive():
                raise BusError(f"proxy thread {forwarder.thread.name} did not stop within {timeout_s} s")
        self._forwarders.clear()
        if self._retainer is not None:
            self._retainer.stop()
            self._retainer = None
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None

    def __enter__(self) -> BusProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _forward(
    frontend: zmq.Socket[bytes],
    backend: zmq.Socket[bytes],
    control: zmq.Socket[bytes],
    capture: zmq.Socket[bytes] | None,
) -> None:
    try:
        zmq.proxy_steerable(frontend, backend, capture, control)
    except zmq.ZMQError as exc:
        if exc.errno not in (zmq.ETERM, zmq.ENOTSOCK):  # those mean the context was shut down under us
            structlog.get_logger("bus.proxy").error("proxy stopped forwarding", error=str(exc))
    finally:
        for socket in (frontend, backend, control, capture):
            if socket is not None:
                socket.close(0)


def main(argv: list[str] | None = None) -> None:
    """Run the proxy as its own process, writing ``RUN_DIR/bus.json`` once bound."""
    parser = argparse.ArgumentParser(prog="python -m bus.proxy", description=main.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--hwm", type=int, default=SocketOptions.hwm)
    parser.add_argument("--curve-dir", default=None)
    args = parser.parse_args(argv)
    plan = plan_addresses(args.run_dir, args.transport, args.host, args.curve_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    proxy = BusProxy(plan, SocketOptions(hwm=args.hwm))
    addresses = proxy.start()
    addresses.save(args.run_dir)
    try:
        stop.wait()
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
