"""How long the supervisor waits for a stage of actors to exit after asking them to stop (pure).

Every stage shares one grace period. Two kinds of trainer get longer, both bounded by
trainer.stop_save_timeout_s: one that reported saving a checkpoint on stop, and one that trained
in this launch and is still heartbeating. The second may be inside a step: it reads the stop
request only when the step ends, then saves its version. On a loaded machine a step that takes
0.4 s can take several seconds, past the grace, and a trainer forced out before its save loses
every version since its last checkpoint. That step gets several times its last duration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

STEP_FINISH_FACTOR = 4.0  # times the trainer's last step
STEP_FINISH_MIN_S = 30.0
# heartbeats of a busy machine pause for seconds together (launch.liveness): a trainer counts as
# alive while its silence is within this many heartbeat limits
SILENCE_TOLERANCE = 4.0


@dataclass(frozen=True)
class StoppingActor:
    saving_since: float | None  # when it reported saving a checkpoint on stop
    last_step_s: float | None  # its last training step (None: not a trainer, or no step yet)
    silent_s: float  # since its last heartbeat


def grace_end(
    actors: Iterable[StoppingActor], deadline: float, asked: float, save_timeout_s: float, heartbeat_limit_s: float
) -> float:
    """When to force the stage's remaining actors out: `deadline` or later (times share one clock;
    `asked`: when the stage was told to stop)."""
    ends = [deadline]
    for actor in actors:
        if actor.saving_since is not None:
            ends.append(actor.saving_since + save_timeout_s)
        elif actor.last_step_s is not None and actor.silent_s < SILENCE_TOLERANCE * heartbeat_limit_s:
            step_wait_s = max(STEP_FINISH_MIN_S, STEP_FINISH_FACTOR * actor.last_step_s)
            ends.append(asked + min(save_timeout_s, step_wait_s))
    return max(ends)
