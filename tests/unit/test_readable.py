"""What people see of recorded values (tap, replay, what-if): plain data, never Python reprs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

import msgspec
import numpy as np

from bus.plain import readable
from psrl.replay.render import _clip


class Mode(Enum):
    FAST = 1


@dataclass(frozen=True)
class Decision:
    instances: tuple[str, ...]
    mode: Mode
    scores: np.ndarray


def test_readable_turns_records_into_plain_data() -> None:
    value = {"decision": Decision(("rollout-0",), Mode.FAST, np.array([0.5, 1.0])),
             "record": msgspec.msgpack.encode({"a": [1, 2]}), "ids": {3, 1}}  # fmt: skip
    assert readable(value) == {
        "decision": {"instances": ["rollout-0"], "mode": "fast", "scores": [0.5, 1.0]},
        "record": {"a": [1, 2]},
        "ids": [1, 3],
    }


def test_what_if_disagreements_print_as_json_not_reprs() -> None:
    # regression: `psrl replay --what-if` printed Python reprs of decisions
    recorded = Decision(("rollout-0",), Mode.FAST, np.array([1.0]))
    text = _clip(recorded)
    assert "Decision(" not in text and json.loads(text) == {"instances": ["rollout-0"], "mode": "fast", "scores": [1.0]}
