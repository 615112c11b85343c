"""ZeroMQ CURVE keys: generation, loading and the authenticator that refuses unknown clients.

A key directory (made by ``psrl keys generate DIR``) holds, in ZeroMQ's certificate format::

    server.key         public key every binding socket presents (the proxy, request servers)
    server.key_secret  its secret key (mode 0600)
    client.key         public key of the default client identity, used by connecting sockets
    client.key_secret  its secret key (mode 0600)
    authorized/        public keys allowed to connect; starts with a copy of client.key

A connecting socket must know the server's public key (otherwise the handshake fails) and its
own public key must be in ``authorized/`` (otherwise the ZAP authenticator of the binding
process refuses it). Copy the directory to every host of the run over a trusted channel.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from bus.errors import BusError

SERVER_NAME = "server"
CLIENT_NAME = "client"
AUTHORIZED_DIR = "authorized"


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes


@dataclass(frozen=True)
class CurveKeys:
    """The keys one process needs: the server pair, its client pair, and who is authorized.

    Everything is read into memory when the keys load, so the files can be removed right after
    (an actor's private copy is, see ``actors.boot``). ``authorized`` is None when the directory
    had no ``authorized/``: such a process can connect but must not bind a CURVE socket.
    """

    server: KeyPair
    client: KeyPair
    authorized: frozenset[bytes] | None
    source: Path


def generate_keys(directory: str | Path, client_name: str = CLIENT_NAME, force: bool = False) -> list[Path]:
    """Create the server pair (unless present) and a client pair, authorizing the client.

    Returns the files written. Refuses to overwrite an existing pair unless `force`.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    (root / AUTHORIZED_DIR).mkdir(exist_ok=True)
    written: list[Path] = []
    if not (root / f"{SERVER_NAME}.key_secret").exists() or force:
        written += _create_pair(root, SERVER_NAME, force)
    written += _create_pair(root, client_name, force)
    authorized = root / AUTHORIZED_DIR / f"{client_name}.key"
    shutil.copyfile(root / f"{client_name}.key", authorized)
    written.append(authorized)
    return written


def _create_pair(root: Path, name: str, force: bool) -> list[Path]:
    public, secret = root / f"{name}.key", root / f"{name}.key_secret"
    if not force and (public.exists() or secret.exists()):
        raise BusError(f"{public} already exists; pass --force to replace the key pair")
    for path in (public, secret):
        path.unlink(missing_ok=True)
    old_umask = os.umask(0o077)  # the secret file must never exist world-readable, even briefly
    try:
        public_file, secret_file = zmq.auth.create_certificates(str(root), name)
    finally:
        os.umask(old_umask)
    os.chmod(public_file, 0o644)
    return [Path(public_file), Path(secret_file)]


def load_keys(directory: str | Path, client_name: str = CLIENT_NAME) -> CurveKeys:
    """Read a key directory; raises BusError naming the missing or unreadable file."""
    root = Path(directory)
    return CurveKeys(
        server=_load_pair(root / f"{SERVER_NAME}.key_secret"),
        client=_load_pair(root / f"{client_name}.key_secret"),
        authorized=_load_authorized(root / AUTHORIZED_DIR),
        source=root,
    )


def _load_authorized(directory: Path) -> frozenset[bytes] | None:
    """The z85 public keys allowed to connect (None when the directory is absent)."""
    if not directory.is_dir():
        return None
    try:
        return frozenset(zmq.auth.load_certificates(str(directory)))
    except (OSError, ValueError) as exc:
        raise BusError(f"CURVE authorized keys in {directory} are not readable: {exc}") from exc


def _load_pair(path: Path) -> KeyPair:
    if not path.is_file():
        raise BusError(f"CURVE key file {path} is missing; create keys with `psrl keys generate {path.parent}`")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise BusError(f"CURVE key file {path} is not readable: {exc}") from exc
    if secret is None:
        raise BusError(f"CURVE key file {path} holds no secret key")
    return KeyPair(public=public, secret=secret)


def apply_curve(socket: zmq.Socket[bytes], keys: CurveKeys, is_server: bool) -> None:
    """Configure CURVE on a socket before it binds (server) or connects (client)."""
    if is_server:
        socket.curve_secretkey = keys.server.secret
        socket.curve_publickey = keys.server.public
        socket.curve_server = True
    else:
        socket.curve_secretkey = keys.client.secret
        socket.curve_publickey = keys.client.public
        socket.curve_serverkey = keys.server.public


def start_authenticator(ctx: zmq.Context[zmq.Socket[bytes]], keys: CurveKeys) -> ThreadAuthenticator:
    """Start the ZAP handler of a binding process: only keys in ``authorized/`` may connect.

    Call once per context before binding CURVE sockets; stop it with ``.stop()`` at shutdown.
    """
    if keys.authorized is None:
        missing = keys.source / AUTHORIZED_DIR
        raise BusError(f"{missing} is missing: no client would be allowed to connect")
    authenticator = ThreadAuthenticator(ctx)
    authenticator.start()
    authenticator.configure_curve_callback(domain="*", credentials_provider=_Allowed(keys.authorized))
    return authenticator


class _Allowed:
    """ZAP credentials check against the public keys read at load time."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys

    def callback(self, domain: str, z85_client_key: bytes) -> bool:
        return z85_client_key in self.keys
