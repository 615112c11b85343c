"""Fuzz the session gateway of a live run of openai-SDK agents, then check the run went on as if nothing happened.

Launches `examples/agent_openai` (its agents talk to the gateway all along, with a bearer token);
once the gateway serves, a sender process of its own (as an outside client would be) fires
``--requests`` bad requests at it, many at once: malformed JSON, wrong fields, an unknown session,
an unknown model, a body over the size limit, a missing or wrong bearer token, floods of concurrent
calls to one session (whose conversation is not the session's), and clients that disconnect in the
middle of a request's body or before reading a streamed answer. Each answered one must get its
status (400/401/404/409/413/429, never a 5xx) and OpenAI's error object; afterwards the gateway
must still answer, the run must train ``AFTER_VERSIONS`` more versions, no actor may have died or
restarted, no session may be lost or have a turn applied twice, the gateway's own error counts
(logged by the scheduler) must cover every refused request, and the replay must agree 100%.

    python tools/fuzz_gateway.py --quick        # 1k requests
    python tools/fuzz_gateway.py                # 10k requests (make fuzz-gateway)

Ends with ``RESULT requests=<n> answered=<n> disconnects=<n> unexpected=<n> server_errors=<n> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bus.eventlog.reader import EventLogReader
from bus.messages import ActorExited, ActorRestarted, TrainerProgress
from bus.schema import Event
from launch.supervisor import EXIT_INTERRUPTED, EXIT_OK, Supervisor
from psrl.config import Config, load_config
from psrl.log import configure
from psrl.preflight import checked
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "examples" / "agent_openai" / "config.yaml")
TOKEN = "fuzz-token"
WORKLOAD = [f"agent.gateway.token={TOKEN}", "bus.handshake_timeout_s=180", "trainer.total_steps=100000"]
AFTER_VERSIONS = 2  # versions the run must publish after the flood before the fuzzer stops it
STOP_REASON = "the gateway fuzzing is done and the run trained on after it"
START_WAIT_S, SEND_TIMEOUT_S, AFTER_WAIT_S = 900.0, 1800.0, 600.0
CONCURRENCY = 16
GOOD = {"model": "psrl", "messages": [{"role": "user", "content": "fuzz"}], "max_tokens": 2}
WRONG_FIELDS: list[tuple[str, Any]] = [
    ("messages", None), ("messages", []), ("messages", "hi"), ("messages", [{"role": "robot", "content": "x"}]),
    ("messages", [3]), ("n", 3), ("max_tokens", 0), ("max_tokens", "ten"), ("stop", 5), ("temperature", 9),
    ("tools", "all"), ("tool_choice", 7), ("top_logprobs", 3),
]  # fmt: skip
KINDS = ("malformed", "fields", "unknown_session", "unknown_model", "oversized", "token", "flood", "disconnect")


@dataclass(frozen=True)
class Shot:
    kind: str
    request: bytes  # the whole HTTP/1.1 request as sent (a disconnect: only its start)
    expect: frozenset[int]  # statuses it may get (empty: a disconnect, no answer read)
    fresh: bool = False  # on a connection of its own, closed after it


def _http(method: str, path: str, body: bytes, token: str | None, length: int | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "host: gateway", "content-type: application/json"]
    head.append(f"content-length: {len(body) if length is None else length}")
    if token is not None:
        head.append(f"authorization: {token}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def shots(seed: int, n: int, max_body: int, sessions: range, token: str = TOKEN) -> list[Shot]:
    """``n`` bad requests at ``sessions`` (a flood is a burst of calls to one session, counted one each)."""
    rng, out = random.Random(seed), list[Shot]()
    auth = f"Bearer {token}"
    while len(out) < n:
        kind = rng.choice(KINDS)
        sid = str(rng.choice(sessions))
        path = f"/sessions/{sid}/v1/chat/completions"
        if kind == "malformed":
            body = rng.choice([b"{", b"\xff\xfe", b"[1, 2]", b"null", b'"x"', b'{"messages": [', b""])
            out.append(Shot(kind, _http("POST", path, body, auth), frozenset({400})))
        elif kind == "fields":
            key, value = rng.choice(WRONG_FIELDS)
            out.append(Shot(kind, _http("POST", path, json.dumps({**GOOD, key: value}).encode(), auth), _400))
        elif kind == "unknown_session":
            body = json.dumps(GOOD).encode()
            out.append(Shot(kind, _http("POST", f"/sessions/nope-{sid}/v1/chat/completions", body, auth), _404))
        elif kind == "unknown_model":
            body = json.dumps({**GOOD, "model": "gpt-9"}).encode()
            out.append(Shot(kind, _http("POST", path, body, auth), _404))
        elif kind == "oversized":  # declared over the limit: refused before the body is read
            out.append(Shot(kind, _http("POST", path, b"", auth, length=max_body + 1), frozenset({413}), fresh=True))
        elif kind == "token":
            wrong = rng.choice([None, "Bearer wrong", token, "Basic eA=="])
            out.append(Shot(kind, _http("POST", path, json.dumps(GOOD).encode(), wrong), frozenset({401})))
        elif kind == "flood":  # the session's agent may be calling too: refused, never a turn
            body = json.dumps({**GOOD, "messages": [{"role": "user", "content": f"flood {rng.random()}"}]}).encode()
            out += [Shot(kind, _http("POST", path, body, auth), _FLOOD) for _ in range(rng.randrange(3, 12))]
        else:
            out.append(_disconnect(rng, path, auth))
    return out[:n]


_400, _404, _FLOOD = frozenset({400}), frozenset({404}), frozenset({404, 409, 429})


def _disconnect(rng: random.Random, path: str, auth: str) -> Shot:
    if rng.random() < 0.5:  # half a body, then gone
        body = json.dumps(GOOD).encode()
        return Shot(
            "disconnect", _http("POST", path, body[: len(body) // 2], auth, length=len(body)), frozenset(), True
        )
    streamed = json.dumps({**GOOD, "stream": True}).encode()  # asks for a stream and leaves at once
    return Shot("disconnect", _http("POST", path, streamed, auth), frozenset(), True)


@dataclass
class Tally:
    sent: Counter[str] = field(default_factory=Counter)  # kind -> requests sent
    statuses: Counter[int] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)  # kind, status, body start (first ones)
    num_unexpected: int = 0
    bad_bodies: int = 0  # answered errors without OpenAI's error object
    healthy_after: bool = False
    seconds: float = 0.0


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    headers = {k.lower(): v for k, v in headers.items()}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() == "close"


async def _fire(host: str, port: int, queue: asyncio.Queue[Shot], tally: Tally) -> None:
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while not queue.empty():
        shot = queue.get_nowait()
        tally.sent[shot.kind] += 1
        if shot.fresh and conn is not None:
            conn[1].close()
            conn = None
        if conn is None:
            conn = await asyncio.open_connection(host, port)
        reader, writer = conn
        writer.write(shot.request)
        await writer.drain()
        if not shot.expect:  # a disconnect: gone before any answer
            writer.close()
            conn = None
            continue
        status, body, closing = await _read_answer(reader)
        _judge(shot, status, body, tally)
        if closing or shot.fresh:
            writer.close()
            conn = None
    if conn is not None:
        conn[1].close()


def _judge(shot: Shot, status: int, body: bytes, tally: Tally) -> None:
    tally.statuses[status] += 1
    if status not in shot.expect:
        tally.num_unexpected += 1
        if len(tally.unexpected) < 10:
            tally.unexpected.append(f"{shot.kind} {status} {body[:160]!r}")
    try:
        error = json.loads(body)["error"]
        ok = set(error) == {"message", "type", "param", "code"} and bool(error["message"])
    except (ValueError, KeyError, TypeError):
        ok = False
    tally.bad_bodies += not ok


async def send_all(url: str, requests: list[Shot], concurrency: int = CONCURRENCY, token: str = TOKEN) -> Tally:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    queue: asyncio.Queue[Shot] = asyncio.Queue()
    for shot in requests:
        queue.put_nowait(shot)
    tally, started = Tally(), time.monotonic()
    await asyncio.gather(*(_fire(host, int(port), queue, tally) for _ in range(concurrency)))
    tally.seconds = time.monotonic() - started
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(_http("GET", "/health", b"", f"Bearer {token}"))
    status, _, _ = await _read_answer(reader)
    writer.close()
    tally.healthy_after = status == 200
    return tally


@dataclass
class Outcome:
    exit_code: int
    reason: str | None
    tally: Tally | None
    error: str | None
    versions_after: int
    deaths: int
    restarts: int
    sessions_lost: int
    sessions_applied_twice: int
    gateway_errors: dict[str, int]  # the scheduler's own count, by status
    replay: dict[str, tuple[int, int]]  # checker -> (agree, decisions)
    run_dir: Path


class GatewayFuzzer:
    """Beside ``Supervisor.run``: waits for the gateway, fires the requests from a sender process, lets
    the run train on, then stops it as an operator would."""

    def __init__(self, supervisor: Supervisor, num_requests: int, seed: int) -> None:
        self.supervisor, self.num_requests, self.seed = supervisor, num_requests, seed
        self.tally: Tally | None = None
        self.error: str | None = None
        self.published = 0
        self.last_request_id = 0  # the newest session seen: floods aim at live ones
        self.versions_after = 0
        self.done = threading.Event()

    def start(self) -> None:
        self.supervisor.listeners = (*self.supervisor.listeners, self._on_event)
        threading.Thread(target=self._run, name="fuzz-gateway", daemon=True).start()

    def _on_event(self, event: Event[Any]) -> None:
        self.published += isinstance(event.message, TrainerProgress)
        self.last_request_id = max(self.last_request_id, int(getattr(event.message, "request_id", 0) or 0))

    def _run(self) -> None:
        try:
            url = self._gateway_url()
            if url is None:
                self.error = "the gateway never served"
                return
            self.tally = self._send(url)
            start, deadline = self.published, time.monotonic() + AFTER_WAIT_S
            while time.monotonic() < deadline and not self.supervisor.is_stopping:
                if self.published - start >= AFTER_VERSIONS:
                    break
                time.sleep(0.2)
            self.versions_after = self.published - start
            if not self.supervisor.is_stopping:
                self.supervisor.interrupt(STOP_REASON)
        except Exception as exc:  # reported by the tool; the run goes on
            self.error = repr(exc)
        finally:
            self.done.set()

    def _gateway_url(self) -> str | None:
        log = self.supervisor.run_dir.path / "logs" / "session.jsonl"
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline and not self.supervisor.is_stopping:
            if self.published >= 1 and log.exists():  # agents are at work: the run is live
                for line in log.read_text().splitlines():
                    if '"session gateway serving"' in line:
                        return str(json.loads(line)["url"])
            time.sleep(0.2)
        return None

    def _send(self, url: str) -> Tally:
        config = self.supervisor.config
        command = [sys.executable, "-m", "tools.fuzz_gateway", "send", url, str(self.num_requests), str(self.seed)]
        command += [str(config.agent.gateway.max_body_bytes), str(max(0, self.last_request_id - 32))]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=SEND_TIMEOUT_S, check=True)
        data = json.loads(done.stdout.strip().splitlines()[-1])
        return Tally(
            Counter(data["sent"]),
            Counter({int(k): v for k, v in data["statuses"].items()}),
            data["unexpected"],
            data["num_unexpected"],
            data["bad_bodies"],
            data["healthy_after"],
            data["seconds"],
        )


def run_fuzz(config: Config, num_requests: int, seed: int, root: Path) -> Outcome:
    supervisor = Supervisor(config, RunDir.create(root, f"fuzz-gateway-{seed}"))
    fuzzer = GatewayFuzzer(supervisor, num_requests, seed)
    fuzzer.start()
    code = supervisor.run()
    fuzzer.done.wait(120)
    events = [e.event for e in EventLogReader(supervisor.run_dir.events).events()]
    sessions = check_invariants(events, config.psrl.staleness).sessions
    report = replay_run(supervisor.run_dir.path, ["all"])
    return Outcome(
        code,
        supervisor.end_reason,
        fuzzer.tally,
        fuzzer.error,
        fuzzer.versions_after,
        sum(isinstance(e.message, ActorExited) for e in events),
        sum(isinstance(e.message, ActorRestarted) for e in events),
        len(sessions.lost),
        len(sessions.applied_twice),
        _gateway_errors(supervisor.run_dir.path / "logs" / "session.jsonl"),
        {c.name: (c.agreement.num_agree, c.agreement.num_decisions - c.agreement.num_skipped) for c in report.checkers},
        supervisor.run_dir.path,
    )


def _gateway_errors(log: Path) -> dict[str, int]:
    for line in reversed(log.read_text().splitlines() if log.exists() else []):
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("event") == "gateway errors":
            return {k: v for k, v in record.items() if k.startswith("http_")}
    return {}


def ran_ok(outcome: Outcome) -> bool:
    stopped = outcome.exit_code == EXIT_INTERRUPTED and outcome.reason == STOP_REASON
    return outcome.exit_code == EXIT_OK or (stopped and outcome.versions_after >= AFTER_VERSIONS)


def uncounted(outcome: Outcome) -> int:
    """Refused requests the gateway's own counts miss (they may count more: the agents' own 409s)."""
    if outcome.tally is None:
        return 0
    counts = outcome.gateway_errors
    return sum(max(0, n - counts.get(f"http_{status}", 0)) for status, n in outcome.tally.statuses.items())


def result_line(outcome: Outcome) -> str:
    tally = outcome.tally or Tally()
    agree = sum(a for a, _ in outcome.replay.values())
    total = sum(t for _, t in outcome.replay.values())
    return (
        f"RESULT requests={sum(tally.sent.values())} answered={sum(tally.statuses.values())} "
        f"disconnects={tally.sent['disconnect']} unexpected={tally.num_unexpected} "
        f"server_errors={sum(n for s, n in tally.statuses.items() if s >= 500)} bad_bodies={tally.bad_bodies} "
        f"uncounted={uncounted(outcome)} healthy_after={int(tally.healthy_after)} "
        f"requests_per_s={sum(tally.sent.values()) / tally.seconds if tally.seconds else 0:.0f} "
        f"crashes={outcome.deaths} restarts={outcome.restarts} sessions_lost={outcome.sessions_lost} "
        f"sessions_applied_twice={outcome.sessions_applied_twice} run_ok={int(ran_ok(outcome))} "
        f"replay_agreement={agree / total if total else float('nan'):.4f}"
    )


def _send_main(argv: list[str]) -> None:
    url, n, seed, max_body, first = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    tally = asyncio.run(send_all(url, shots(seed, n, max_body, range(first, first + 96))))
    data = {**tally.__dict__, "statuses": {str(k): v for k, v in tally.statuses.items()}}
    print(json.dumps(data))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["send"]:  # the sender process
        _send_main(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1k requests")
    parser.add_argument("--requests", type=int, default=None, help="bad requests in all (default 10k)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--root", type=Path, default=None, help="where the run directory goes")
    parser.add_argument("overrides", nargs="*", help="config overrides")
    args = parser.parse_args(argv)
    configure("warning")
    config = checked(load_config(CONFIG, [*WORKLOAD, *args.overrides]))
    root = args.root or Path(tempfile.mkdtemp(prefix="psrl-fuzz-gateway-"))
    outcome = run_fuzz(config, args.requests or (1000 if args.quick else 10_000), args.seed, root)
    tally = outcome.tally or Tally()
    print(f"sent by kind: {dict(tally.sent)}; statuses: {dict(tally.statuses)}")
    print(f"unexpected (first ones): {tally.unexpected}; fuzzer error: {outcome.error}")
    print(f"gateway's error counts: {outcome.gateway_errors}; replay: {outcome.replay}")
    print(f"run: exit {outcome.exit_code} ({outcome.reason}) at {outcome.run_dir}")
    print(result_line(outcome))


if __name__ == "__main__":
    main()
