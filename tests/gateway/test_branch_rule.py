"""The branch rule of a run's session (``psrl.gateway.branch``): where a cut keeps, what it appends,
what it refuses, and the arrays it cuts (the response's, and a prompt cut inside the prompt)."""

from __future__ import annotations

import numpy as np
import pytest

from psrl.gateway.branch import NO_CUT, BranchRefusedError, cut_prompt, cut_response, plan_cut

PROMPT = [1, 2, 3]  # the row's prompt
# prompt, turn 0 generated (7 8), observation (4 5), turn 1 generated (9 6)
CURRENT = [*PROMPT, 7, 8, 4, 5, 9, 6]
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1]


def test_a_continuation_is_no_cut() -> None:
    cut = plan_cut(CURRENT, MASK, [*CURRENT, 4, 4], [*MASK, 0, 0], 3, "session 1 turn 2")
    assert (cut.cut_to, cut.observation, cut.num_cut, cut.is_cut) == (-1, [4, 4], 0, False)


def test_a_dropped_last_reply_cuts_back_to_the_longest_common_prefix() -> None:
    # the agent dropped turn 1's reply and sent another message after the same observation start
    prompt = [*PROMPT, 7, 8, 4, 2, 2]
    cut = plan_cut(CURRENT, MASK, prompt, [0, 0, 0, 1, 1, 0, 0, 0], 3, "session 1 turn 2")
    assert cut.is_cut and cut.cut_to == 3  # response tokens kept: 7 8 4
    assert cut.observation == [2, 2] and cut.num_cut == 3  # 5 9 6 dropped


def test_the_kept_prefix_stops_where_the_loss_masks_differ() -> None:
    # the client sends the model's tokens back as its own (mask 0 in the branch's record): not kept as trained
    prompt = [*PROMPT, 7, 8, 4, 5, 9, 1]
    cut = plan_cut(CURRENT, MASK, prompt, [0, 0, 0, 1, 1, 0, 0, 0, 0], 3, "w")
    assert cut.cut_to == 4 and cut.observation == [9, 1] and cut.num_cut == 2


def test_a_cut_back_to_the_prompt_keeps_no_response() -> None:
    cut = plan_cut(CURRENT, MASK, [*PROMPT, 5], [0, 0, 0, 0], 3, "w")
    assert (cut.cut_to, cut.observation, cut.num_cut) == (0, [5], 6)


def test_an_edit_inside_the_row_s_prompt_cuts_the_prompt_and_drops_the_whole_response() -> None:
    # a changed system prompt or a dropped first reply: the call's prompt leaves the row's after 1 token
    cut = plan_cut(CURRENT, MASK, [1, 9, 9], [0, 0, 0], 3, "session 4 turn 2")
    assert cut.is_cut and (cut.cut_to, cut.prompt_keep) == (0, 1)
    assert cut.observation == [9, 9] and cut.num_cut == len(CURRENT) - 1  # 2 3 and the whole response
    assert cut.point == (0, 1) and plan_cut(CURRENT, MASK, [*CURRENT, 4], [*MASK, 0], 3, "w").point == NO_CUT


def test_a_session_whose_prompt_was_cut_measures_its_next_cut_from_its_own_prompt() -> None:
    # after a prompt cut to 1 token, the session is [1] + observation (9 9, mask 0) + a turn (7, mask 1)
    current, mask = [1, 9, 9, 7], [0, 0, 0, 1]
    cut = plan_cut(current, mask, [1, 9, 9, 5], [0, 0, 0, 0], 1, "w")
    assert (cut.cut_to, cut.prompt_keep, cut.observation, cut.num_cut) == (2, -1, [5], 1)


def test_a_call_sharing_no_token_with_the_session_is_refused_naming_session_and_turn() -> None:
    with pytest.raises(BranchRefusedError, match=r"session 4 turn 2: the conversation shares no token"):
        plan_cut(CURRENT, MASK, [5, 2, 3], [0, 0, 0], 3, "session 4 turn 2")


def test_cut_prompt_keeps_a_non_empty_proper_prefix() -> None:
    prompt = np.array([1, 2, 3], np.int32)
    assert cut_prompt(prompt, 2, 0).tolist() == [1, 2]
    for bad in (0, 3, -1):
        with pytest.raises(ValueError, match=f"prompt_keep is {bad}; the prompt has 3 tokens"):
            cut_prompt(prompt, bad, 0)
    with pytest.raises(ValueError, match="a cut inside the prompt drops the response"):
        cut_prompt(prompt, 2, 1)


def test_cut_response_cuts_all_four_arrays_alike_and_refuses_a_cut_past_the_response() -> None:
    ids, logprobs = np.arange(6, dtype=np.int32), np.linspace(-1, 0, 6).astype(np.float32)
    versions, mask = np.array([3, 3, 3, 4, 4, 4], np.int32), np.array([1, 1, 0, 0, 1, 1], np.uint8)
    cut = cut_response(ids, logprobs, versions, mask, 4)
    assert [len(a) for a in cut] == [4, 4, 4, 4]
    assert cut[0].tolist() == [0, 1, 2, 3] and cut[2].tolist() == [3, 3, 3, 4] and cut[3].tolist() == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="cut_to is 7; the response has 6 tokens"):
        cut_response(ids, logprobs, versions, mask, 7)
    with pytest.raises(ValueError, match="cut_to is -2"):
        cut_response(ids, logprobs, versions, mask, -2)
