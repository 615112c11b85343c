"""mini-swe-agent (from PyPI, in its own venv) driven as a black-box command through the session
gateway: by the agent runner against the in-process gateway (which branches: mini drops a malformed
reply from its history and feeds the format error back), and trained end to end by ``psrl launch``
with SmolLM2-135M-Instruct on 2 CPU cores, where each session's gateway record equals what reached
the trainer, token for token. The model's answers may be poor; the plumbing is what is checked."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.mini_swe

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mini_swe_agent"
MINI_PYTHON = ROOT / ".venv-mini" / "bin" / "python"
SMOLLM2 = Path(os.environ.get("PSRL_MODELS_DIR", Path.home() / ".cache" / "psrl" / "models")) / "SmolLM2-135M-Instruct"

# the example's command, then the session's gateway record kept for the test; the reward stays last
RECORDING = """
import json, os, subprocess, sys
from pathlib import Path
import httpx

command = [sys.executable, "{script}", *sys.argv[1:]]
done = subprocess.run(command, input=sys.stdin.read(), capture_output=True, text=True)
sys.stderr.write(done.stderr)
if done.returncode:
    raise SystemExit(done.returncode)
session = os.environ["OPENAI_BASE_URL"].rstrip("/").removesuffix("/v1")
record = httpx.get(session, headers={{"Authorization": f"Bearer {{os.environ['OPENAI_API_KEY']}}"}}).json()
Path("{records}", os.environ["PSRL_SESSION_ID"] + ".json").write_text(json.dumps(record))
print(done.stdout.strip().splitlines()[-1])
"""


def _need_mini_and_model() -> None:
    if not MINI_PYTHON.exists():
        pytest.fail("mini-swe-agent's venv is missing: make install-mini-swe")
    if not (SMOLLM2 / "model.safetensors").exists():
        pytest.fail("SmolLM2-135M-Instruct is missing: make model-smollm2")


def test_mini_swe_agent_feeds_format_errors_back_through_the_in_process_gateway(tmp_path: Path) -> None:
    _need_mini_and_model()
    from psrl.envs.host import StepRequest
    from psrl.gateway.codec import load_codec
    from psrl.gateway.local import EngineGateway
    from psrl.gateway.runner import AgentRunner
    from psrl.gateway.sessions import Settings

    command = f"{MINI_PYTHON} {EXAMPLE / 'run_mini.py'} agent.max_consecutive_format_errors=3"
    with EngineGateway(str(SMOLLM2), settings=Settings(max_turn_tokens=48), temperature=1.0, seed=3) as gateway:
        spec = {
            "entry": "",
            "command": command,
            "dataset": str(EXAMPLE / "rows.jsonl"),
            "timeout_s": 300,
            "model_dir": str(SMOLLM2),
            "chat_template": "auto",
            "base_url": gateway.url,
            "token": "",
        }
        runner = AgentRunner(spec)
        reply = runner.run(StepRequest(request_id=7, prompt_id=0, turn=0, actions=[]))
        assert reply.error == "" and reply.done, reply.error
        assert reply.reward in (0.0, 1.0)
        record = gateway.gateway.record("7")
        generated = gateway.generations  # what the engine saw and produced, per call
    trajectories = record["trajectories"]
    assert sum(len(t["turns"]) for t in trajectories) >= 1
    # every turn's prompt and generation are the engine's, byte for byte
    for prompt, output in generated:
        assert any(t["token_ids"][: len(prompt) + len(output)] == prompt + output for t in trajectories)
    # mini drops a reply it cannot parse and sends its format error instead: a branch from the shared
    # prefix whose new tokens carry that error; a parsed reply's command output continues the trajectory
    codec = load_codec(str(SMOLLM2))
    for traj in trajectories[1:]:
        assert traj["branch_of"] >= 0  # they share the system prompt at least
        parent = trajectories[traj["branch_of"]]
        assert traj["token_ids"][: traj["branch_at"]] == parent["token_ids"][: traj["branch_at"]]
        assert "Format error" in codec.decode(traj["token_ids"][traj["branch_at"] :])
    continued = [t for t in trajectories if t["branch_of"] < 0 and len(t["turns"]) > 1]
    assert len(trajectories) >= 2 or continued, "mini neither fed an error back nor ran a command"
    for traj in continued:
        assert "<returncode>" in codec.decode(traj["token_ids"])


def test_mini_swe_agent_trains_through_psrl_launch_with_exact_tokens(tmp_path: Path) -> None:
    _need_mini_and_model()
    from bus.messages import FinishReason, SessionEnd, TrajectoryDone, TurnDone
    from launch.supervisor import Supervisor
    from psrl.config import load_config
    from psrl.gateway.agent_task import AgentTask
    from psrl.reliability.invariants import check_invariants
    from psrl.replay.runner import replay_run
    from psrl.rundir import RunDir
    from tests.system.run_checks import read_run

    records = tmp_path / "records"
    records.mkdir()
    wrapper = tmp_path / "recording_mini.py"
    wrapper.write_text(RECORDING.format(script=EXAMPLE / "run_mini.py", records=records))
    overrides = [
        f"agent.command={MINI_PYTHON} {wrapper}",
        f"model.path={SMOLLM2}",
        "topology.warm_spares=0",
        "bus.handshake_timeout_s=180",
    ]
    config = load_config(str(EXAMPLE / "config.yaml"), overrides)
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "mini"))
    assert sup.run() == 0, sup.end_reason
    events = read_run(sup.run_dir.events).events
    messages = [e.message for e in events]

    ends = [m for m in messages if isinstance(m, SessionEnd)]
    assert ends and max(Counter(m.request_id for m in ends).values()) == 1  # every session ended once
    assert any(not m.error for m in ends), [m.error for m in ends]  # rewards delivered
    done = Counter((m.request_id, m.turn) for m in messages if isinstance(m, TurnDone))
    assert max(done.values()) == 1  # no turn applied twice

    task = AgentTask.from_config(config)
    trained = [m for m in messages if isinstance(m, TrajectoryDone) and m.finish_reason == FinishReason.STOP]
    checked = 0
    for traj in trained:
        path = records / f"{traj.request_id}.json"
        if not path.exists():
            continue
        [recorded] = json.loads(path.read_text())["trajectories"]
        prompt = list(task.prompt(traj.prompt_id).token_ids)
        assert recorded["token_ids"] == prompt + np.asarray(traj.token_ids).tolist()
        mask = np.ones(len(traj.token_ids)) if traj.loss_mask is None else np.asarray(traj.loss_mask)
        assert recorded["loss_mask"] == [0] * len(prompt) + mask.astype(int).tolist()
        assert len(recorded["turns"]) == traj.num_turns
        checked += 1
    assert checked >= 2, (checked, len(trained))

    sessions = check_invariants(events, config.psrl.staleness).sessions
    assert not (sessions.lost or sessions.applied_twice or sessions.broken), sessions
    report = replay_run(sup.run_dir.path, ["all"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, checker.name
