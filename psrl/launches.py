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
