"""The shipped calibration of the demo on CPU: cost model, trainer and pull times.

``demo_cost_model.json`` is a ``psrl calibrate`` fit of the demo model (one torch thread);
``demo_run_models.json`` holds the trainer and pull models read from a real ``psrl launch`` of
the demo (docs/benchmarks.md, section "simulator", has the commands). The simulator uses them when
it is given no other calibration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from psrl.engine_cost.model import CostModel, load_cost_model
from psrl.sim.models import PullModel, TrainerModel

DEMO_COST_MODEL = Path(__file__).resolve().parent / "demo_cost_model.json"
DEMO_RUN_MODELS = Path(__file__).resolve().parent / "demo_run_models.json"


def demo_cost_model() -> CostModel:
    return load_cost_model(DEMO_COST_MODEL)


def load_run_models(path: Path = DEMO_RUN_MODELS) -> tuple[TrainerModel, PullModel]:
    data = json.loads(path.read_text())
    return TrainerModel(**data["trainer"]), PullModel(tuple(data["pull_s"]))


def save_run_models(trainer: TrainerModel, pull: PullModel, meta: dict[str, Any], path: Path) -> None:
    data = {
        "trainer": {"step_s": trainer.step_s, "token_s": trainer.token_s, "publish_s": trainer.publish_s},
        "pull_s": list(pull.samples_s),
        "meta": meta,
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
