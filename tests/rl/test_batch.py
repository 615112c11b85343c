"""Trajectory validation, batch layout and the group filter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from psrl.errors import RequestError
from psrl.rl.batch import Sample, collate, scatter_rows
from psrl.rl.filters import filter_groups, has_learning_signal
from psrl.rl.trajectory import TOKEN_FIELDS, InvalidTrajectoryError, Trajectory


def make(prompt: tuple[int, ...], response: tuple[int, ...], **kwargs: object) -> Trajectory:
    fields: dict[str, object] = {
        "prompt_id": 3,
        "child": 0,
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "rollout_log_probs": tuple(-0.1 * (i + 1) for i in range(len(response))),
        "token_versions": tuple(2 for _ in response),
        "version": 2,
        "reward": 1.0,
    }
    fields.update(kwargs)
    return Trajectory(**fields)  # type: ignore[arg-type]


class TestTrajectory:
    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"prompt_token_ids": ()}, "empty prompt"),
            ({"rollout_log_probs": (-0.1,)}, "rollout_log_probs has 1 entries"),
            ({"token_versions": (2, 1)}, "older than V_traj"),
            ({"rollout_log_probs": (-0.1, 0.5)}, "finite and <= 0"),
            ({"rollout_log_probs": (-0.1, float("nan"))}, "finite and <= 0"),
            ({"loss_mask": (1, 2)}, "0 or 1"),
            ({"reward": float("inf")}, "finite"),
            ({"version": -1, "token_versions": ()}, "negative"),
        ],
    )
    def test_refuses_inconsistent_fields(self, changes: dict[str, object], message: str) -> None:
        with pytest.raises(InvalidTrajectoryError, match=message) as info:
            make((1, 2), (5, 6), **changes)
        assert isinstance(info.value, RequestError)
        assert info.value.request_id == "3/0"

    def test_optional_fields_may_be_empty(self) -> None:
        t = make((1,), (5, 6, 7), rollout_log_probs=(), token_versions=(), loss_mask=(1, 0, 1))
        assert t.num_response_tokens == 3
        assert t.num_trained_tokens == 2

    def test_per_token_fields_are_read_only_arrays_of_the_wire_dtypes(self) -> None:
        t = make((1, 2), (5, 6), loss_mask=(1, 0))
        dtypes = {name: getattr(t, name).dtype for name in TOKEN_FIELDS}
        assert dtypes == {name: np.dtype(dtype) for name, dtype in TOKEN_FIELDS.items()}
        assert not any(getattr(t, name).flags.writeable for name in TOKEN_FIELDS)
        with pytest.raises(ValueError, match="read-only"):
            t.response_token_ids[0] = 9
        tokens = np.asarray([5, 6], np.int32)
        assert np.shares_memory(make((1,), tokens).response_token_ids, tokens)  # taken as it is
        assert tokens.flags.writeable  # the caller's array keeps its own flags

    def test_equal_trajectories_compare_by_their_tokens(self) -> None:
        assert make((1, 2), (5, 6)) == make(np.asarray([1, 2]), [5, 6])
        assert make((1, 2), (5, 6)) != make((1, 2), (5, 7))
        assert make((1, 2), (5, 6)) != make((1, 2), (5, 6), loss_mask=(1, 1))
        assert len({make((1, 2), (5, 6)), make((1, 2), (5, 6))}) == 1

    def test_a_field_that_is_not_a_token_vector_is_refused(self) -> None:
        with pytest.raises(InvalidTrajectoryError, match=r"response_token_ids: .*1-D"):
            make((1, 2), ((5, 6), (7, 8)))
        with pytest.raises(InvalidTrajectoryError, match="loss_mask"):
            make((1, 2), (5, 6), loss_mask=(1, -1))


class TestCollate:
    def test_left_padded_prompts_right_padded_responses(self) -> None:
        a = make((1, 2), (5, 6, 7), loss_mask=(1, 0, 1))
        b = make((3, 4, 8), (9,), prompt_id=4, acc=1.0, version=2)
        batch = collate([Sample(a), Sample(b)], pad_token_id=0)
        assert batch.prompt_length == 3
        assert batch.input_ids.tolist() == [[0, 1, 2, 5, 6, 7], [3, 4, 8, 9, 0, 0]]
        assert batch.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
        assert batch.position_ids.tolist() == [[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 3, 3]]
        assert batch.token_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
        assert batch.response_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
        assert batch.response_token_ids().tolist() == [[5, 6, 7], [9, 0, 0]]
        assert batch.token_versions.tolist() == [[2, 2, 2], [2, -1, -1]]
        assert batch.group_index.tolist() == [0, 1]
        assert torch.isnan(batch.acc[0]) and batch.acc[1] == 1.0
        assert batch.has_rollout_log_probs
        torch.testing.assert_close(batch.rollout_log_probs[0], torch.tensor([-0.1, -0.2, -0.3]))

    def test_fields_round_trip(self) -> None:
        samples = [Sample(make((1,), (5, 6))), Sample(make((1,), (5,)))]
        scatter_rows(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), samples, "advantages")
        assert samples[1].fields["advantages"].tolist() == [3.0]
        batch = collate(samples, pad_token_id=0)
        assert batch.fields["advantages"].tolist() == [[1.0, 2.0], [3.0, 0.0]]

    def test_missing_engine_log_probs_are_flagged(self) -> None:
        batch = collate([Sample(make((1,), (5,), rollout_log_probs=()))], pad_token_id=0)
        assert not batch.has_rollout_log_probs

    def test_empty_response_keeps_one_masked_column(self) -> None:
        batch = collate([Sample(make((1,), (), rollout_log_probs=(), token_versions=()))], pad_token_id=0)
        assert batch.response_length == 1
        assert batch.response_mask.sum() == 0

    def test_refuses_mismatched_fields_and_empty_input(self) -> None:
        with pytest.raises(ValueError):
            collate([], pad_token_id=0)
        with pytest.raises(ValueError):
            collate([Sample(make((1,), (5,)), {"x": torch.zeros(1)}), Sample(make((1,), (5,)))], pad_token_id=0)


def test_group_filter_drops_zero_variance_groups() -> None:
    group_a = [make((1,), (5,), prompt_id=1, child=c, reward=r, acc=1.0) for c, r in enumerate((1.0, 0.0))]
    group_b = [make((1,), (5,), prompt_id=2, child=c, reward=0.5, acc=float(c)) for c in range(2)]
    kept, dropped = filter_groups(group_a + group_b, "score")
    assert dropped == [2]
    assert [t.prompt_id for t in kept] == [1, 1]
    kept, dropped = filter_groups(group_a + group_b, "acc")
    assert dropped == [1]
    assert has_learning_signal(group_b, "acc")
    with pytest.raises(ValueError):
        has_learning_signal([make((1,), (5,))], "acc")
