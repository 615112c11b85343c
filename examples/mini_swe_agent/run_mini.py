"""A psrl agent command: mini-swe-agent, unchanged, on one small task in a temporary directory.

Run by the session's env worker with the row as JSON on stdin and ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` set to the session's gateway endpoint; runs the ``mini`` command line (its own
loop: the model's reply parsed for one bash block, the command run, its output or the format error
fed back, until it submits or hits its step limit) with this directory's ``mini_psrl.yaml`` (and
this script's arguments as more ``-c`` specs), in a fresh temporary directory. The reward, printed
last: 1.0 when the task's file holds the expected text, else 0.0; mini's exit status and its
number of model calls go to stderr.

Needs mini-swe-agent (its own venv: ``make install-mini-swe``); run it with that venv's python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    row = json.loads(sys.stdin.read())
    with tempfile.TemporaryDirectory(prefix="mini-swe-") as work:
        trajectory = Path(work) / "trajectory.json"
        command = [
            sys.executable, "-m", "minisweagent.run.mini",
            "-c", str(HERE / "mini_psrl.yaml"),
            "-c", f"model.model_kwargs.api_base={os.environ['OPENAI_BASE_URL']}",
            "-c", f"model.model_kwargs.api_key={os.environ['OPENAI_API_KEY']}",
            "-c", f"environment.cwd={work}",
            *(spec for extra in sys.argv[1:] for spec in ("-c", extra)),
            "-t", row["task"], "--yolo", "--exit-immediately", "-o", str(trajectory),
        ]  # fmt: skip
        env = {**os.environ, "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1", "LITELLM_LOG": "ERROR"}
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
            raise SystemExit(f"mini exited with {done.returncode}")
        info = json.loads(trajectory.read_text())["info"]
        target = Path(work) / row["file"]
        solved = target.is_file() and target.read_text().strip() == row["expected"]
        print(f"mini: exit_status={info['exit_status']} api_calls={info['model_stats']['api_calls']}", file=sys.stderr)
        print(json.dumps({"score": 1.0 if solved else 0.0, "acc": 1.0 if solved else 0.0}))


if __name__ == "__main__":
    main()
