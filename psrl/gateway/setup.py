"""A run's gateway from its config: the sessions' logic, the server's settings, the workers' spec."""

from __future__ import annotations

import ipaddress
import json
import secrets
from pathlib import Path
from typing import Any

from psrl.gateway.agent_task import model_directory
from psrl.gateway.chat_templates import load_template
from psrl.gateway.codec import load_codec
from psrl.gateway.sessions import Gateway, Settings


def build_gateway(config: Any) -> Gateway:
    """The scheduler's gateway: one trajectory per session (the router's), turns capped by env.max_turn_tokens."""
    model_dir = model_directory(config)
    settings = config.agent.gateway
    codec = load_codec(model_dir)
    context = _context_tokens(model_dir, config.task.max_prompt_length + config.task.max_response_length)
    return Gateway(
        load_template(model_dir, settings.chat_template),
        codec.encode,
        codec.decode,
        codec.text,
        Settings(
            settings.max_trim_tokens,
            settings.tool_parser,
            config.env.max_turn_tokens,
            context,
            one_trajectory=True,
        ),
    )


def run_token(host: str, configured: str) -> str:
    """The bearer token: the configured one; none on loopback; a fresh random one on any other interface."""
    if configured or _is_loopback(host):
        return configured
    return secrets.token_urlsafe(24)


def local_url(host: str, port: int) -> str:
    """Where this host's env workers reach the gateway (a wildcard bind is reached on loopback)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def worker_spec(config: Any, base_url: str, token: str) -> str:
    """What an agent worker needs (``psrl.gateway.runner.serve_agents``), as JSON for its process."""
    agent = config.agent
    return json.dumps(
        {
            "entry": agent.entry,
            "command": agent.command,
            "dataset": agent.dataset,
            "timeout_s": agent.timeout_s,
            "model_dir": model_directory(config),
            "chat_template": agent.gateway.chat_template,
            "base_url": base_url,
            "token": token,
        }
    )


def _context_tokens(model_dir: str, fallback: int) -> int:
    path = Path(model_dir) / "config.json"
    if path.is_file():
        value = json.loads(path.read_text()).get("max_position_embeddings")
        if isinstance(value, int):
            return value
    return fallback


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
