import pytest
import yaml

from psrl.config import load_config, to_yaml
from psrl.config.loader import parse_override, schema_paths
from psrl.errors import ConfigError

RC = "psrl.rollout_coordination."


def problems_of(*overrides: str, preset: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(preset, list(overrides))
    return str(info.value)


class TestDefaults:
    def test_shipped_defaults_of_the_seeds(self) -> None:
        c = load_config()
        rc = c.psrl.rollout_coordination
        assert rc.partial_rollout.enable is True
        assert rc.partial_rollout.interrupt_as_prompt is False
        assert rc.redundant_rollout.enable is False
        assert rc.routing_strategy.method == "request_num_balance"
        assert rc.routing_strategy.admission_reject_on_waiting is True
        assert rc.routing_strategy.max_num_waiting_reqs_after_preemption == 1024
        assert rc.routing_strategy.delta_throughput_threshold == 0.5
        assert rc.sync_and_mig_strategy.method == "greedy"
        assert rc.sync_and_mig_strategy.mig.enable is False
        assert rc.session_strategy.thunder_agent.enable is False
        assert rc.session_strategy.thunder_agent.continue_scope == "bucketed"
        assert c.psrl.lmcache.enable is False
        assert c.psrl.lmcache.multi_version_kv is True
        assert c.psrl.lmcache.clear_on_weight_update is False
        assert c.psrl.status_collection.enable is True
        assert c.psrl.log_prob.enable_rollout_engine_log_prob is True
        assert c.psrl.fine_grain_overlap.granularity == "none"
        assert c.psrl.fine_grain_overlap.overlap_scope == "recompute"
        assert c.psrl.staleness_buffer_entries == 512

    def test_inherited_redundancy_sizes_are_resolved(self) -> None:
        c = load_config(None, ["psrl.staleness_buffer_entries=64", "psrl.rollout_n=8"])
        red = c.psrl.rollout_coordination.redundant_rollout
        assert (red.alg_global_batch_size, red.redundant_global_batch_size) == (64, 64)
        assert (red.alg_rollout_n, red.redundant_rollout_n) == (8, 8)

    def test_every_preset_is_valid(self) -> None:
        from psrl.config import available_presets

        names = available_presets()
        assert {"demo", "sync", "reasoning", "agentic"} <= set(names)
        for name in names:
            load_config(name)


class TestOverrides:
    def test_seed_style_overrides(self) -> None:
        c = load_config(None, ["psrl.staleness=2", RC + "partial_rollout.enable=True"])
        assert c.psrl.staleness == 2
        assert c.psrl.rollout_coordination.partial_rollout.enable is True

    def test_resolved_yaml_contains_override_and_defaults_and_reloads(self, tmp_path) -> None:
        text = to_yaml(load_config(None, ["psrl.staleness=2"]))
        tree = yaml.safe_load(text)
        assert tree["psrl"]["staleness"] == 2
        assert tree["psrl"]["rollout_coordination"]["routing_strategy"]["method"] == "request_num_balance"
        path = tmp_path / "resolved.yaml"
        path.write_text(text)
        assert load_config(str(path)) == load_config(None, ["psrl.staleness=2"])

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("a.b=2", 2),
            ("a.b=True", True),
            ("a.b=false", False),
            ("a.b=None", None),
            ("a.b=0.5", 0.5),
            ("a.b=x", "x"),
            ("a.b=[1, 2]", [1, 2]),
        ],
    )
    def test_values_parse_as_yaml_scalars(self, text: str, expected: object) -> None:
        assert parse_override(text) == ("a.b", expected)

    def test_typo_suggests_the_real_key(self) -> None:
        assert "did you mean psrl.staleness" in problems_of("psrl.stalenes=2")

    @pytest.mark.parametrize(
        ("typed", "suggested"),
        [
            ("trainer.total_step=3", "trainer.total_steps?"),
            ("trainr.total_steps=3", "trainer.total_steps?"),
            ("trainer.staleness=1", "psrl.staleness?"),  # the right key under the wrong section
            ("reward.timeout=5", "reward.timeout_s?"),
        ],
    )
    def test_only_close_keys_are_suggested(self, typed: str, suggested: str) -> None:
        assert f"did you mean {suggested}" in problems_of(typed)

    @pytest.mark.parametrize("typed", ["trainer.foo=1", "psrl.rollout_coordination.blah=1"])
    def test_an_unrelated_key_gets_no_suggestion(self, typed: str) -> None:
        # regression: the whole path's similarity proposed trainer.seed for trainer.foo (a shared prefix)
        message = problems_of(typed)
        assert "did you mean" not in message and "psrl config docs" in message

    def test_moved_key_names_its_new_path(self) -> None:
        msg = problems_of("psrl.partial_rollout.enable=True")
        assert RC + "partial_rollout.enable" in msg

    def test_upstream_only_key_is_refused_with_reason(self) -> None:
        assert "not applicable" in problems_of("psrl.rollout_gateway.enable=True")

    def test_verl_alias_is_accepted(self) -> None:
        c = load_config(None, ["train_actor_rollout_ref.actor.ppo_epochs=2"])
        assert c.actor.ppo_epochs == 2

    def test_all_problems_are_reported_at_once(self) -> None:
        msg = problems_of(
            "psrl.stalenes=2",
            "psrl.staleness=abc",
            "psrl.staleness_buffer_entries=0",
            RC + "routing_strategy.method=throughput_optimal",
        )
        assert "problems" in msg
        for needle in ("psrl.stalenes", "give an integer", "routing_strategy.cost_model_path"):
            assert needle in msg

    def test_setting_a_section_is_refused(self) -> None:
        assert "section" in problems_of("psrl.fine_grain_overlap=3")

    def test_every_schema_leaf_is_settable(self) -> None:
        leaves = [p for p, is_section in schema_paths().items() if not is_section]
        assert len(leaves) > 100
        assert "psrl.rollout_coordination.routing_strategy.kv_transfer.transfer_mode" in leaves
