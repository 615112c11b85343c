from psrl.config.chunk_plan import plan_chunks


def plan(granularity, multiplier=1, *, buffer=64, n=8, mini=16, micro=4, dp=2):
    return plan_chunks(
        granularity,
        multiplier,
        buffer_groups=buffer,
        rollout_n=n,
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=micro,
        dp_size=dp,
    )


def test_none_waits_for_the_buffer() -> None:
    p = plan("none")
    assert (p.effective, p.chunk_groups, p.clamped) == ("none", 64, False)


def test_mini_batch_chunk_is_mini_batch_times_multiplier() -> None:
    p = plan("mini_batch", 2)
    assert (p.effective, p.chunk_groups, p.clamped) == ("mini_batch", 32, False)
    assert p.num_chunks(64) == 2


def test_mini_batch_larger_than_buffer_clamps_to_none() -> None:
    p = plan("mini_batch", 5)
    assert (p.effective, p.chunk_groups, p.clamped) == ("none", 64, True)


def test_micro_batch_stays_micro_when_smaller_than_mini_batch() -> None:
    p = plan("micro_batch", 2)  # 4 x 2 ranks x 2 = 16 samples = 2 groups of 8
    assert (p.effective, p.chunk_groups, p.clamped) == ("micro_batch", 2, False)


def test_micro_batch_rounds_up_to_whole_groups() -> None:
    p = plan("micro_batch", 1, n=3)  # 8 samples -> 3 groups of 3
    assert p.chunk_groups == 3


def test_micro_batch_larger_than_mini_batch_clamps_to_mini_batch() -> None:
    p = plan("micro_batch", 17)  # 136 samples > 16 groups x 8
    assert (p.effective, p.chunk_groups, p.clamped) == ("mini_batch", 16, True)


def test_micro_batch_clamps_through_to_none_when_mini_batch_exceeds_buffer() -> None:
    p = plan("micro_batch", 100, buffer=8)
    assert (p.effective, p.chunk_groups, p.clamped) == ("none", 8, True)
