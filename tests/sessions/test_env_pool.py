"""Env worker processes: steps run in real processes; environments that raise, hang past their
timeout or answer malformed fail only their own step; a killed or hung worker is replaced and its
step runs again on a fresh worker, which rebuilds the episode by replay."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from actors.env_pool import EnvPool
from bus.messages import EnvStepDone
from psrl.assets import DEMO_MODEL_DIR
from psrl.config.system import Env

ENVIRONMENT = """
import os, time
from psrl.envs.base import StepResult
from psrl.tasks.base import Prompt, Reward

class Task:
    name = "faulty"
    def prompt(self, index): return Prompt(index, "x", "go=", "")
    def reward(self, prompt, response): return Reward(0.0, 0.0)
    def make(self, prompt): return Env()

class Env:
    def __init__(self): self.steps = []
    def reset(self): return "go="
    def step(self, action):
        self.steps.append(action)
        if action == "raise": raise RuntimeError("tool exploded")
        if action == "hang": time.sleep(60)
        if action == "bad": return {"observation": 1}
        if action == "die": os.kill(os.getpid(), 9)
        if action == "slow": time.sleep(3)
        return StepResult(" ".join(self.steps), 1.0, 1.0, done=False)

def make(seed): return Task()
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> EnvPool:
    directory = tmp_path_factory.mktemp("envs")
    (directory / "faulty_env.py").write_text(ENVIRONMENT)
    sys.path.insert(0, str(directory))  # spawned workers start with this process's sys.path
    settings = Env(enable=True, num_workers=2, step_timeout_s=8.0, worker_retry_limit=1)
    pool = EnvPool(settings, "faulty_env:make", 0, str(DEMO_MODEL_DIR))
    pool.wait_ready()
    yield pool
    pool.close()
    sys.path.remove(str(directory))


def ids(text: str) -> np.ndarray:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(DEMO_MODEL_DIR) / "tokenizer.json"))
    return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, np.int32)


def collect(pool: EnvPool, count: int, timeout_s: float = 90.0) -> dict[int, EnvStepDone]:
    replies: dict[int, EnvStepDone] = {}
    deadline = time.monotonic() + timeout_s
    while len(replies) < count and time.monotonic() < deadline:
        replies.update((r.request_id, r) for r in pool.poll())
        time.sleep(0.02)
    assert len(replies) == count, f"only {sorted(replies)} answered"
    return replies


def test_failures_fail_only_their_own_step(pool: EnvPool) -> None:
    actions = {1: "raise", 2: "bad", 3: "hang", 4: "fine", 5: "die"}
    for rid, action in actions.items():
        pool.submit(rid, 0, 0, [ids(action)])
    replies = collect(pool, len(actions))
    assert "RuntimeError: tool exploded" in replies[1].error
    assert "EnvError" in replies[2].error and "StepResult" in replies[2].error
    assert "timed out after 8 s" in replies[3].error
    assert replies[4].error == "" and replies[4].observation_token_ids.tolist() == ids("fine").tolist()
    assert "gave up after 2 attempts" in replies[5].error  # died on its first worker and on the retry
    assert pool.num_restarts >= 3  # the stuck worker and both dead ones were replaced


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_worker_killed_or_hung_mid_step_is_replaced_and_the_step_runs_again(pool: EnvPool, fault: int) -> None:
    """A hung worker is told from a slow one by its heartbeat: the 60 s step above times out, this
    worker (stopped: no heartbeat) is replaced within seconds and its step runs again."""
    history = [ids("fine"), ids("slow")]
    request_id = 7 + fault
    pool.submit(request_id, 0, 1, history)  # turn 1: a fresh worker must replay turn 0 first
    deadline = time.monotonic() + 30
    while not any(w.step is not None for w in pool.workers) and time.monotonic() < deadline:
        pool.poll()
        time.sleep(0.02)
    victim = next(w for w in pool.workers if w.step is not None)
    time.sleep(0.5)
    pool.take_readies()
    os.kill(victim.process.pid, fault)
    reply = collect(pool, 1)[request_id]
    assert reply.error == ""
    assert reply.observation_token_ids.tolist() == ids("fine slow").tolist()  # the episode was rebuilt
    [ready] = [r for r in pool.take_readies() if r.replaced_pid == victim.process.pid]  # reported once
    assert ready.worker == victim.index and ready.pid == pool.workers[victim.index].process.pid
    assert ready.reason.startswith("env worker") and ready.startup_ms > 0
