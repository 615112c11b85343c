"""How actor incarnations are numbered across the launches of one run.

Every launch of a run (a fresh start, then each resume) numbers its actors' incarnations from
``launch * INCARNATIONS_PER_LAUNCH``; an actor restarted within a launch takes the next number. So an
event's incarnation says which launch it belongs to, and whether its actor is a replacement.
"""

from __future__ import annotations

INCARNATIONS_PER_LAUNCH = 1000


def launch_of(incarnation: int) -> int:
    return incarnation // INCARNATIONS_PER_LAUNCH


def is_replacement(incarnation: int) -> bool:
    """A restart within its launch (the rest of the run is ahead of it)."""
    return incarnation % INCARNATIONS_PER_LAUNCH > 0


def nothing_to_do(run_name: str, trained_version: int, total_steps: int) -> str | None:
    """Why a launch of an existing run has nothing to train (None when it has): its latest checkpoint
    already holds `trainer.total_steps` versions. Starting the actors anyway would wait forever for a
    step that no one trains."""
    if trained_version <= 0 or trained_version < total_steps:
        return None
    more = max(trained_version, total_steps) * 2
    return (
        f"run {run_name} already did its {trained_version} training steps (trainer.total_steps={total_steps}): "
        f"nothing to do. To train further, launch it again with a higher trainer.total_steps "
        f"(e.g. trainer.total_steps={more})."
    )
