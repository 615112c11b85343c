"""Sharding plan and manifests: balance by bytes, blocks of large tensors, checksums and digests."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ps_helpers import small_model

from psrl.ps.checksum import checksum
from psrl.ps.manifest import (
    ALIGNMENT,
    ManifestError,
    build_manifest,
    entry_bytes,
    validate_served_parts,
)
from psrl.ps.plan import PlanError, TensorSpec, plan_shards


def specs_of(model: dict[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec.of(name, t) for name, t in model.items()]


class TestPlan:
    def test_every_element_is_in_exactly_one_entry(self) -> None:
        specs = specs_of(small_model())
        plan = plan_shards(specs, num_shards=3, max_block_bytes=10_000)
        for spec in specs:
            pieces = sorted((e.elem_start, e.num_elems) for e in plan.entries if e.name == spec.name)
            cursor = 0
            for start, count in pieces:
                assert start == cursor
                cursor += count
            assert cursor == spec.num_elems

    def test_large_tensors_are_split_into_near_equal_blocks(self) -> None:
        plan = plan_shards([TensorSpec("big", (1000, 100), "float32")], num_shards=2, max_block_bytes=100_000)
        sizes = [e.num_bytes for e in plan.entries]
        assert len(sizes) == 4
        assert max(sizes) <= 100_000
        assert max(sizes) - min(sizes) <= 4  # one element of difference at most

    def test_blocks_balance_one_huge_tensor_over_shards(self) -> None:
        plan = plan_shards([TensorSpec("emb", (4096, 256), "float32")], num_shards=4, max_block_bytes=1 << 20)
        assert plan.shard_bytes() == [1 << 20] * 4

    @settings(max_examples=60, deadline=None)
    @given(
        sizes=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=40),
        num_shards=st.integers(min_value=1, max_value=8),
        block=st.integers(min_value=64, max_value=8192),
    )
    def test_shard_loads_differ_by_at_most_one_entry(self, sizes: list[int], num_shards: int, block: int) -> None:
        specs = [TensorSpec(f"t{i}", (n,), "float32") for i, n in enumerate(sizes)]
        plan = plan_shards(specs, num_shards, block)
        loads = plan.shard_bytes()
        largest_entry = max(e.num_bytes for e in plan.entries)
        assert max(loads) - min(loads) <= largest_entry
        assert sum(loads) == 4 * sum(sizes)
        assert [e.index for e in plan.entries] == list(range(len(plan.entries)))

    def test_plan_is_deterministic(self) -> None:
        specs = specs_of(small_model())
        assert plan_shards(specs, 3, 4096) == plan_shards(specs, 3, 4096)

    @pytest.mark.parametrize(
        ("specs", "num_shards", "block"),
        [([], 2, 100), ([TensorSpec("a", (2,), "float32")], 0, 100), ([TensorSpec("a", (2,), "float32")], 1, 0)],
    )
    def test_bad_requests_are_refused(self, specs: list[TensorSpec], num_shards: int, block: int) -> None:
        with pytest.raises(PlanError):
            plan_shards(specs, num_shards, block)

    def test_duplicate_names_are_refused(self) -> None:
        with pytest.raises(PlanError, match="unique"):
            plan_shards([TensorSpec("a", (2,), "float32")] * 2, 1, 100)


class TestManifest:
    def test_entries_carry_layout_and_checksums(self) -> None:
        model = small_model()
        plan = plan_shards(specs_of(model), 2, 8192)
        manifest = build_manifest(7, plan, model)
        assert manifest.version == 7
        for entry in manifest.entries:
            assert entry.shard_offset % ALIGNMENT == 0
            assert entry.checksum == checksum(entry_bytes(model, entry))
        for shard in range(2):
            part = manifest.shard_part(shard)
            ends = [e.shard_offset + e.num_bytes for e in part]
            assert all(end <= nxt.shard_offset for end, nxt in zip(ends, part[1:], strict=False))

    def test_digest_changes_with_any_byte(self) -> None:
        model = small_model()
        plan = plan_shards(specs_of(model), 2, 8192)
        before = build_manifest(1, plan, model).digest()
        model["layer.0.b"][3] += 1e-3
        assert build_manifest(1, plan, model).digest() != before

    def test_tensors_that_do_not_match_the_plan_are_refused(self) -> None:
        model = small_model()
        plan = plan_shards(specs_of(model), 2, 8192)
        model["layer.0.w"] = torch.zeros(3, 3)
        with pytest.raises(ManifestError, match=r"layer\.0\.w"):
            build_manifest(1, plan, model)
        del model["layer.0.w"]
        with pytest.raises(ManifestError, match="missing"):
            build_manifest(1, plan, model)

    def test_served_parts_must_cover_every_entry_once(self) -> None:
        model = small_model()
        manifest = build_manifest(1, plan_shards(specs_of(model), 2, 8192), model)
        parts = [manifest.shard_part(0), manifest.shard_part(1)]
        validate_served_parts(1, parts, len(manifest.entries))
        with pytest.raises(ManifestError):
            validate_served_parts(1, [parts[0], parts[1][1:]], len(manifest.entries))
        with pytest.raises(ManifestError):
            validate_served_parts(1, [parts[1], parts[0]], len(manifest.entries))
