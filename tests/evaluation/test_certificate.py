"""The staleness certificate: built from TrainData and importance weights, re-derived from generation events."""

from __future__ import annotations

import numpy as np
import torch

from bus.messages import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    RequestSampling,
    TrainData,
    TrajectoryDone,
    TrajectoryFlags,
)
from psrl.evaluation.certificate import (
    Derivation,
    build,
    is_by_trajectory,
    is_plausible,
    recorded_rows,
    staleness_problems,
)
from psrl.evaluation.study import StudyRun, result_line, summarize
from psrl.rl.batch import Sample
from psrl.rl.trajectory import Trajectory

I32 = np.int32


def data(buffer: int, request_ids: list[int], v_traj: list[int], versions: list[list[int]], flags=None) -> TrainData:
    lengths = [len(v) for v in versions]
    return TrainData(
        step=buffer + 1, buffer=buffer, chunk=0, num_chunks=1,
        prompt_ids=np.asarray([r // 2 for r in request_ids], I32), request_ids=np.asarray(request_ids, I32),
        v_traj=np.asarray(v_traj, I32), prompt_lengths=np.ones(len(request_ids), I32),
        response_lengths=np.asarray(lengths, I32), prompt_token_ids=np.ones(len(request_ids), I32),
        response_token_ids=np.ones(sum(lengths), I32), response_logprobs=np.zeros(sum(lengths), np.float32),
        response_versions=np.asarray([x for v in versions for x in v], I32),
        rewards=np.zeros(len(request_ids), np.float32), accs=np.zeros(len(request_ids), np.float32),
        finish_reasons=np.zeros(len(request_ids), I32), flags=None if flags is None else np.asarray(flags, I32),
    )  # fmt: skip


def test_build_collects_versions_flags_and_importance_weights() -> None:
    chunk = data(3, [6, 7], [2, 3], [[2, 3, 3], [3]], flags=[3, 0])
    cert = build([chunk], 4, {(3, 0): (0.9, 0.25)}, responses_per_prompt=2, threshold=2.0)
    assert (cert.buffer, cert.version, cert.is_threshold) == (3, 4, 2.0)
    assert cert.min_token_version.tolist() == [2, 3] and cert.max_token_version.tolist() == [3, 3]
    assert cert.flags.tolist() == [3, 0]
    assert cert.is_mean[0] == np.float32(0.9) and np.isnan(cert.is_mean[1])  # not measured on this rank
    assert is_plausible(cert) and staleness_problems(cert, staleness=1) == []
    assert staleness_problems(cert, staleness=0)  # V_traj 2 in buffer 3 breaks a bound of 0


def test_importance_statistics_per_trajectory_leave_masked_tokens_out() -> None:
    traj = Trajectory(prompt_id=5, child=1, prompt_token_ids=(1,), response_token_ids=(1, 2, 3, 4),
                      rollout_log_probs=(0.0,) * 4, token_versions=(0,) * 4, version=0, reward=0.0)  # fmt: skip
    sample = Sample(traj, {"is_weights": torch.tensor([1.0, 2.0, 0.0, 0.5])})
    ((key, (mean, clipped)),) = is_by_trajectory([sample], threshold=2.0).items()
    assert key == (5, 1) and abs(mean - 3.5 / 3) < 1e-6 and abs(clipped - 1 / 3) < 1e-6


def events(rid: int) -> list[tuple[object, str]]:
    sampling = RequestSampling(max_tokens=8)
    first = GenerateRequest(request_id=rid, prompt_id=rid // 2, prompt_token_ids=np.ones(3, I32), sampling=sampling)
    cut = GenerateResult(request_id=rid, prompt_id=0, token_ids=np.asarray([5], I32),
                         logprobs=np.zeros(1, np.float32), versions=np.asarray([1], I32),
                         finish_reason=FinishReason.ABORT, instance="a", error="sync")  # fmt: skip
    again = GenerateRequest(request_id=rid, prompt_id=rid // 2, prompt_token_ids=np.ones(3, I32), sampling=sampling,
                            generated_token_ids=np.asarray([5], I32))  # fmt: skip
    end = GenerateResult(request_id=rid, prompt_id=0, token_ids=np.asarray([5, 6], I32),
                         logprobs=np.zeros(2, np.float32), versions=np.asarray([1, 2], I32),
                         finish_reason=FinishReason.STOP, instance="b")  # fmt: skip
    done = TrajectoryDone(request_id=rid, prompt_id=rid // 2, v_traj=1, token_ids=np.asarray([5, 6], I32),
                          logprobs=np.zeros(2, np.float32), versions=np.asarray([1, 2], I32),
                          finish_reason=FinishReason.STOP, instance="b")  # fmt: skip
    return [(first, "coordinator-router.link"), (first, "router.link"), (cut, "a-router.link"),
            (again, "router.link"), (end, "b-router.link"), (done, "router.link")]  # fmt: skip


def test_derivation_from_events_matches_what_the_router_recorded() -> None:
    derivation = Derivation()
    for message, sender in events(4):
        derivation.observe(message, sender)
    row = derivation.trajectory(4)
    everything = TrajectoryFlags.INTERRUPTED | TrajectoryFlags.CONTINUED | TrajectoryFlags.MIGRATED
    assert row == (4, 1, 1, 2, int(everything))
    cert = build([data(2, [4], [1], [[1, 2]], flags=[int(everything)])], 3, {}, responses_per_prompt=2, threshold=2.0)
    assert recorded_rows(cert) == [row]
    assert derivation.trajectory(99) is None  # never generated: the check disagrees


def test_a_sessions_next_turn_is_neither_an_interruption_nor_a_continuation() -> None:
    """Each turn of a multi-turn session is a new request of the same trajectory, its prompt grown by the
    previous turn and the environment's reply: the router records no flag for that, nor may the replay."""
    sampling = RequestSampling(max_tokens=8)
    derivation = Derivation()
    for turn, prompt_length in enumerate((3, 9)):
        request = GenerateRequest(request_id=6, prompt_id=3, prompt_token_ids=np.ones(prompt_length, I32),
                                  sampling=sampling)  # fmt: skip
        result = GenerateResult(request_id=6, prompt_id=3, token_ids=np.asarray([5, 6], I32),
                                logprobs=np.zeros(2, np.float32), versions=np.asarray([turn, turn], I32),
                                finish_reason=FinishReason.STOP, instance="a")  # fmt: skip
        derivation.observe(request, "router.link")
        derivation.observe(result, "a-router.link")
    done = TrajectoryDone(request_id=6, prompt_id=3, v_traj=0, token_ids=np.ones(10, I32),
                          logprobs=np.zeros(10, np.float32), versions=np.asarray([0] * 8 + [1, 1], I32),
                          finish_reason=FinishReason.STOP, instance="a")  # fmt: skip
    derivation.observe(done, "router.link")
    assert derivation.trajectory(6) == (6, 0, 0, 1, 0)
    # an interruption inside a later turn is still seen
    for message, sender in events(6)[1:4]:
        derivation.observe(message, sender)
    assert derivation.flags_so_far(6)[0] & TrajectoryFlags.INTERRUPTED


def test_a_next_turn_logged_after_its_own_result_is_still_a_new_turn() -> None:
    """The log merges senders: the instance's result for a session's next turn can reach it before the
    router's request for that turn. The events' send times order them as they happened (seen in a run,
    where log order made a plain three-turn session look interrupted and continued)."""
    sampling = RequestSampling(max_tokens=8)
    derivation = Derivation()
    sent = []
    for turn, prompt_length in enumerate((3, 9, 15)):
        request = GenerateRequest(request_id=6, prompt_id=3, prompt_token_ids=np.ones(prompt_length, I32),
                                  sampling=sampling)  # fmt: skip
        result = GenerateResult(request_id=6, prompt_id=3, token_ids=np.asarray([5, 6], I32),
                                logprobs=np.zeros(2, np.float32), versions=np.asarray([turn, turn], I32),
                                finish_reason=FinishReason.STOP, instance="a")  # fmt: skip
        sent += [(request, "router.link", 100 * turn), (result, "a-router.link", 100 * turn + 50)]
    sent[2], sent[3] = sent[3], sent[2]  # turn 1's result logged before turn 1's request
    for message, sender, time_ns in sent:
        derivation.observe(message, sender, time_ns=time_ns)
    assert derivation.flags_so_far(6)[0] == TrajectoryFlags(0)
    in_log_order = Derivation()
    for message, sender, _ in sent:
        in_log_order.observe(message, sender)
    assert in_log_order.flags_so_far(6)[0] != TrajectoryFlags(0), "without send times the order misleads"


def test_the_study_table_compares_with_synchronous_at_equal_steps() -> None:
    runs = [StudyRun("sync", s, {0: 0.2, 10: 0.4 + s / 100}, 0.5, 100.0, 0.0, 0.0, 4.0) for s in range(2)]
    runs += [StudyRun("s2_tis", s, {0: 0.2, 10: 0.38}, 0.5, 50.0, 2.0, 0.01, 4.0) for s in range(2)]
    rows = summarize(runs, ["sync", "s2_tis"])
    assert rows[0].acc_mean == 0.405 and round(rows[1].acc_gap, 6) == 2.5 and rows[1].speedup == 2.0
    assert result_line(rows).startswith("RESULT acc_gap_s2_tis=2.5 speedup_s2=2.00")
