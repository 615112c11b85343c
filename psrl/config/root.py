"""The root configuration: every section, with inherited values resolved."""

from __future__ import annotations

from pydantic import model_validator

from psrl.config.agents import Agent
from psrl.config.base import Section, section
from psrl.config.data import Data, Logging, RewardSettings
from psrl.config.psrl_section import PsrlSection
from psrl.config.system import Bus, EngineSettings, Env, Model, RunSettings, TaskSettings, Topology
from psrl.config.training import ActorSettings, Algorithm, Critic, Eval, TrainerLoop


class Config(Section):
    """A complete psrl run configuration."""

    psrl: PsrlSection = section(PsrlSection, "Staleness control and rollout coordination.")
    algorithm: Algorithm = section(Algorithm, "RL algorithm.")
    actor: ActorSettings = section(ActorSettings, "Policy optimisation on the trainer.")
    critic: Critic = section(Critic, "Value model (GAE only).")
    trainer: TrainerLoop = section(TrainerLoop, "Training loop and checkpoints.")
    eval: Eval = section(Eval, "Held-out evaluation during training (every trainer.eval_interval versions).")
    model: Model = section(Model, "Policy checkpoint.")
    task: TaskSettings = section(TaskSettings, "Prompt generator, prompt and response lengths, sampling.")
    env: Env = section(Env, "Multi-turn environments (agentic RL sessions).")
    agent: Agent = section(Agent, "Agents with their own loop, through the OpenAI-compatible session gateway.")
    data: Data = section(Data, "A dataset of prompts (instead of the task's generator).")
    reward: RewardSettings = section(RewardSettings, "A reward function of your own, or a built-in verifier.")
    topology: Topology = section(Topology, "How many actors of each kind.")
    engine: EngineSettings = section(EngineSettings, "Rollout engine.")
    bus: Bus = section(Bus, "Message bus.")
    run: RunSettings = section(RunSettings, "Run directory and logging.")
    logging: Logging = section(Logging, "Experiment trackers besides TensorBoard and metrics.jsonl.")

    @model_validator(mode="after")
    def _inherit_redundancy_sizes(self) -> Config:
        """Fill unset redundancy sizes from their base values, so the resolved config is explicit."""
        red = self.psrl.rollout_coordination.redundant_rollout
        if red.alg_global_batch_size is None:
            red.alg_global_batch_size = self.psrl.staleness_buffer_entries
        if red.redundant_global_batch_size is None:
            red.redundant_global_batch_size = red.alg_global_batch_size
        if red.alg_rollout_n is None:
            red.alg_rollout_n = self.psrl.rollout_n
        if red.redundant_rollout_n is None:
            red.redundant_rollout_n = red.alg_rollout_n
        return self

    @model_validator(mode="after")
    def _resolve_env_token_weight(self) -> Config:
        """ThunderAgent's weight of resting sessions' KV, unset: 0 where the offload tier keeps it, else 1."""
        thunder = self.psrl.rollout_coordination.session_strategy.thunder_agent
        if thunder.enable and thunder.env_token_weight is None:
            thunder.env_token_weight = 0.0 if self.psrl.lmcache.enable else 1.0
        return self

    @property
    def entries_per_buffer(self) -> int:
        """Slots per staleness buffer (B' with batch-level redundancy, else B)."""
        red = self.psrl.rollout_coordination.redundant_rollout
        if red.enable and red.redundant_global_batch_size is not None:
            return red.redundant_global_batch_size
        return self.psrl.staleness_buffer_entries

    @property
    def responses_per_prompt(self) -> int:
        """Responses launched per prompt (N' with group-level redundancy, else N)."""
        red = self.psrl.rollout_coordination.redundant_rollout
        if red.enable and red.redundant_rollout_n is not None:
            return red.redundant_rollout_n
        return self.psrl.rollout_n
