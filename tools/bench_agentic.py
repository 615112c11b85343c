#!/usr/bin/env python3
"""The agentic workload under three rollout-coordination settings, in one invocation.

The same multi-turn sessions (``tool_add``: every turn is one tool round trip, so sessions run
``env.max_turns`` turns and their contexts grow turn by turn) on the real flows, engines and
trainer in one process (``psrl.flows.driver.InProcessRun``: no sockets, a virtual clock for
timers, real engine work), under

  a  balance   request_num_balance, no stickiness
  b  sticky    cache_aware_v1 with trajectory stickiness
  c  thunder   (b) plus ThunderAgent hang/continue (bucketed)

Printed per setting: turns/s and trajectories/s (wall clock), the prefix-cache hit rate of the
prompt tokens, the hit tokens as a share of what a perfect sticky placement could reuse (every
turn's context before the environment's reply), re-prefilled tokens per turn, KV-full
preemptions, and hung session-seconds (virtual clock).

  python tools/bench_agentic.py [--steps 1] [--instances 2] [--kv-blocks 96]

The last line is ``RESULT agentic_speedup_vs_balance=<(c)/(a) turns/s> prefix_hit_rate=<(c)>
reuse_of_perfect=<(c)> sticky_speedup_vs_balance=<(b)/(a)>``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bus.messages import SessionEnd, TurnDone
from psrl.config import load_config
from psrl.flows.driver import InProcessRun
from psrl.flows.effects import Effect, Send

RC = "psrl.rollout_coordination."
SETTINGS = {
    "balance": [
        RC + "routing_strategy.method=request_num_balance",
        RC + "routing_strategy.enable_trajectory_sticky=false",
        RC + "session_strategy.thunder_agent.enable=false",
    ],
    "sticky": [RC + "session_strategy.thunder_agent.enable=false"],
    "thunder": [RC + "session_strategy.thunder_agent.enable=true"],
}


@dataclass
class Outcome:
    wall_s: float
    turns: int
    trajectories: int
    hit_tokens: int
    queried_tokens: int
    reusable_tokens: int
    preemptions: int
    hung_s: float

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall_s


def run(name: str, args: argparse.Namespace) -> Outcome:
    overrides = [
        "task.name=tool_add",
        "env.max_turns=4",
        "env.max_turn_tokens=16",
        f"trainer.total_steps={args.steps}",
        f"topology.n_rollout_instances={args.instances}",
        f"engine.num_kv_blocks={args.kv_blocks}",
        "psrl.staleness=0",  # one buffer of sessions in flight
        "psrl.staleness_buffer_entries=8",
        "psrl.rollout_n=4",
        "actor.ppo_mini_batch_size=8",
        RC + "session_strategy.thunder_agent.buffer_per_session=16",
        *SETTINGS[name],
    ]
    driver = InProcessRun(load_config("agentic", overrides))
    counts = {"turns": 0, "ends": 0, "reusable": 0}

    def tap(sender: str, effect: Effect, now: float) -> None:
        if isinstance(effect, Send):
            message = effect.message
            if isinstance(message, TurnDone):
                counts["turns"] += 1
                counts["reusable"] += message.num_tokens  # the context the next turn could reuse
            elif isinstance(message, SessionEnd) and not message.error:
                counts["ends"] += 1

    driver.bus.tap = tap
    started = time.perf_counter()
    driver.run()
    wall = time.perf_counter() - started
    statuses = [i.engine.status() for i in driver.instances]
    session = driver.session
    return Outcome(
        wall_s=wall,
        turns=counts["turns"],
        trajectories=counts["ends"],
        hit_tokens=sum(s.num_prefix_hit_tokens for s in statuses),
        queried_tokens=sum(s.num_prefix_queried_tokens for s in statuses),
        reusable_tokens=counts["reusable"],
        preemptions=sum(s.num_preemptions_total for s in statuses),
        hung_s=session.num_hung_s if session is not None else 0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--kv-blocks", type=int, default=96)
    args = parser.parse_args()
    outcomes = {name: run(name, args) for name in SETTINGS}
    print(
        f"{'setting':8} {'turns/s':>8} {'traj/s':>7} {'hit rate':>8} {'of perfect':>10} {'reprefill/turn':>14} "
        f"{'preempt':>7} {'hung s':>7}"
    )
    for name, o in outcomes.items():
        print(
            f"{name:8} {o.turns_per_s:8.2f} {o.trajectories / o.wall_s:7.2f} "
            f"{o.hit_tokens / max(o.queried_tokens, 1):8.3f} {o.hit_tokens / max(o.reusable_tokens, 1):10.3f} "
            f"{(o.queried_tokens - o.hit_tokens) / max(o.turns, 1):14.1f} {o.preemptions:7d} {o.hung_s:7.1f}"
        )
    a, b, c = outcomes["balance"], outcomes["sticky"], outcomes["thunder"]
    print(
        f"RESULT agentic_speedup_vs_balance={c.turns_per_s / a.turns_per_s:.3f} "
        f"prefix_hit_rate={c.hit_tokens / max(c.queried_tokens, 1):.3f} "
        f"reuse_of_perfect={c.hit_tokens / max(c.reusable_tokens, 1):.3f} "
        f"sticky_speedup_vs_balance={b.turns_per_s / a.turns_per_s:.3f}"
    )


if __name__ == "__main__":
    main()
