"""Checker ``staleness``: each step's certificate (``train.certificate``) against the generation events.

For every trained trajectory the certificate's V_traj, token-version range and flags must be what
the router's ``group.trajectory`` and ``gen.request`` events and the instances' ``gen.result``
events say (``psrl.evaluation.certificate.Derivation``); the buffer's trajectories must be the
groups the coordinator handed over (``train.batch``); every row must respect the staleness bound
of the run's config and the version order; the importance-weight columns must be in range.
"""

from __future__ import annotations

from typing import Any

from bus.messages import StalenessCertificate, TrainBatch
from bus.schema import Event
from psrl.config import Config
from psrl.evaluation.certificate import Derivation, is_plausible, recorded_rows, staleness_problems
from psrl.replay.checker import Checker, register_checker


@register_checker
class StalenessChecker(Checker):
    """Each step's staleness certificate against the generation events and the staleness bound."""

    name = "staleness"
    inputs = ("gen.request", "gen.result", "group.trajectory", "train.batch")
    decisions = ("train.certificate",)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.derivation = Derivation()
        self.batches: dict[int, list[int]] = {}  # buffer -> prompt groups handed to the trainer
        self.responses_per_prompt = config.responses_per_prompt
        self.staleness = config.psrl.staleness

    def observe(self, event: Event[Any]) -> None:
        message = event.message
        if isinstance(message, TrainBatch):
            self.batches[message.buffer] = sorted(message.prompt_ids)
        else:
            envelope = event.envelope
            self.derivation.observe(message, envelope.sender, envelope.incarnation, envelope.wall_ns)

    def recorded(self, event: Event[StalenessCertificate]) -> tuple[Any, ...]:
        cert = event.message
        groups = sorted({int(r) // self.responses_per_prompt for r in cert.request_ids})
        problems = staleness_problems(cert, self.staleness)
        return cert.buffer, cert.version, groups, recorded_rows(cert), problems, is_plausible(cert)

    def redecide(self, event: Event[Any]) -> tuple[Any, ...]:
        cert: StalenessCertificate = event.message
        rows = [self.derivation.trajectory(int(r)) for r in cert.request_ids]
        return cert.buffer, cert.buffer + 1, self.batches.get(cert.buffer), rows, [], True
