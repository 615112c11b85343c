"""Run metrics to Weights & Biases (`logging.wandb.enable`, the wandb extra), next to metrics.jsonl and TensorBoard.

A launcher listener like `MetricsSink`: every `obs.metrics` event is logged as
``<sender>/<metric>`` against a ``train/step`` axis (senders report the same step at different
times, so W&B's own monotonic step is not used). The W&B run id is derived from the run
directory, so a resumed psrl run continues its W&B run. In offline mode (the default) the W&B run
is written under ``<run>/wandb`` and needs no network; `wandb sync <run>/wandb/offline-run-*`
uploads it later. A W&B failure never ends the run: it is logged and the sink turns itself off.
"""

from __future__ import annotations

import hashlib
from typing import Any

from bus.messages import Metrics
from bus.schema import Event
from psrl.config import Config
from psrl.errors import MissingExtraError
from psrl.log import get_logger
from psrl.report.metrics_file import MetricsRecord
from psrl.rundir import RunDir

STEP_KEY = "train/step"


def wandb_run_id(run_dir: RunDir) -> str:
    return "psrl-" + hashlib.sha1(str(run_dir.path).encode()).hexdigest()[:12]


class WandbSink:
    def __init__(self, config: Config, run_dir: RunDir) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise MissingExtraError("logging.wandb.enable", "wandb", "wandb") from exc
        settings = config.logging.wandb
        self.log = get_logger("psrl.wandb", run=run_dir.name)
        directory = run_dir.path / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        self.run: Any = wandb.init(
            project=settings.project, entity=settings.entity, name=settings.name or run_dir.name,
            mode=settings.mode, dir=str(run_dir.path), tags=settings.tags, id=wandb_run_id(run_dir),
            resume="allow", config=config.model_dump(mode="json"),
        )  # fmt: skip
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        self.num_logged = 0

    def on_event(self, event: Event[Any]) -> None:
        if self.run is None or not isinstance(event.message, Metrics):
            return
        record = MetricsRecord.from_event(event)
        values: dict[str, float] = {f"{record.sender}/{name}": value for name, value in record.values.items()}
        try:
            self.run.log({STEP_KEY: record.step, **values})
        except Exception as error:  # wandb raises its own error types; metrics must never end the run
            self.log.error("W&B logging failed; no more metrics go to W&B", error=repr(error))
            self.close()
            return
        self.num_logged += 1

    def close(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish()
            except Exception as error:  # a failed upload is reported, never raised
                self.log.error("W&B finish failed", error=repr(error))
