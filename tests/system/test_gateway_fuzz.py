"""10k bad requests at the session gateway of a live run of openai-SDK agents (`tools/fuzz_gateway.py`):
each gets its OpenAI error and status, the gateway counts every one, disconnects mid-request and
mid-stream harm nothing, and the run trains on with no actor lost, no session lost or turn applied
twice, and a replay agreeing 100%."""

from __future__ import annotations

import pytest

from psrl.config import load_config
from tools import fuzz_gateway

pytestmark = [pytest.mark.system, pytest.mark.slow]


def test_ten_thousand_bad_requests_during_a_live_agent_run(tmp_path) -> None:
    config = load_config(fuzz_gateway.CONFIG, fuzz_gateway.WORKLOAD)
    outcome = fuzz_gateway.run_fuzz(config, 10_000, seed=3, root=tmp_path / "runs")
    tally = outcome.tally
    assert outcome.error is None and tally is not None, outcome.error
    assert fuzz_gateway.ran_ok(outcome), (outcome.exit_code, outcome.reason, outcome.versions_after)
    assert sum(tally.sent.values()) == 10_000 and set(tally.sent) == set(fuzz_gateway.KINDS)
    assert tally.num_unexpected == 0, tally.unexpected
    assert tally.bad_bodies == 0 and not [s for s in tally.statuses if s >= 500]
    assert sum(tally.statuses.values()) == 10_000 - tally.sent["disconnect"]
    assert tally.healthy_after
    assert fuzz_gateway.uncounted(outcome) == 0, (tally.statuses, outcome.gateway_errors)
    assert outcome.deaths == 0 and outcome.restarts == 0
    assert outcome.sessions_lost == 0 and outcome.sessions_applied_twice == 0
    assert all(agree == total > 0 for agree, total in outcome.replay.values() if total), outcome.replay
    assert outcome.replay["sessions"][1] > 0
