"""A publisher process for tests: gen.result, obs.metrics and actor.heartbeat events every 20 ms until SIGTERM.

Run as ``python publisher_proc.py RUN_DIR SENDER``. It stops by itself after about a minute so a
failed test cannot leave it running.
"""

from __future__ import annotations

import signal
import sys
import time

import numpy as np
import zmq

from bus.addresses import BusAddresses
from bus.messages import ActorState, FinishReason, GenerateResult, Heartbeat, Metrics
from bus.publisher import Publisher

MAX_STEPS = 3000


def main(run_dir: str, sender: str) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    ctx = zmq.Context()
    publisher = Publisher(ctx, BusAddresses.load(run_dir), sender)
    if not publisher.wait_subscribed(30, prefix=""):  # the run's logger listens to every kind
        raise SystemExit("nobody subscribed to the bus within 30 s")
    for step in range(1, MAX_STEPS + 1):
        if stopping:
            break
        tokens = np.array([step, step + 1], np.int32)
        result = GenerateResult(
            request_id=step,
            prompt_id=step,
            token_ids=tokens,
            logprobs=np.zeros(2, np.float32),
            versions=np.full(2, 3, np.int32),
            finish_reason=FinishReason.STOP,
            instance="rollout-0",
        )
        publisher.publish(result, request_id=step, model_version=3)
        publisher.publish(Metrics(step, {"loss": 1.0 / step}))
        publisher.publish(Heartbeat(ActorState.BUSY))
        time.sleep(0.02)
    publisher.close()
    ctx.term()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
