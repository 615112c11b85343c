"""Modelled environments for simulated multi-turn sessions.

The simulation runs the real session scheduler flow (``psrl.flows.session.SessionFlow``, with its
ThunderAgent ticks); only the environment is modelled: each step answers after the configured
tool latency (``env.latency_ms`` and its distribution, on the simulated clock) with
``observation_tokens`` tokens, and an episode runs ``env.max_turns`` turns, so each context grows
by a turn's tokens and a reply per turn. The modelled engines charge a turn the part of its context
their prefix cache does not hold (``psrl.sim.prefix_cache``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bus.messages import EnvStepDone
from psrl.config.system import Env
from psrl.envs.latency import step_delay_s
from psrl.sim.events import EventQueue

OBSERVATION_TOKENS = 32


class SimEnv:
    def __init__(
        self,
        clock: EventQueue,
        settings: Env,
        answer: Callable[[EnvStepDone, float], None],
        observation_tokens: int = OBSERVATION_TOKENS,
    ) -> None:
        self.clock = clock
        self.settings = settings
        self.answer = answer
        self.observation = np.zeros(observation_tokens, np.int32)
        self.cancelled: set[int] = set()

    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        done = EnvStepDone(request_id=request_id, turn=turn, observation_token_ids=self.observation)
        delay = step_delay_s(self.settings, request_id, turn)
        self.clock.at(self.clock.now + delay, lambda now: self._answer(done, now))

    def cancel(self, request_id: int) -> None:
        self.cancelled.add(request_id)

    def _answer(self, done: EnvStepDone, now: float) -> None:
        if done.request_id not in self.cancelled:
            self.answer(done, now)
