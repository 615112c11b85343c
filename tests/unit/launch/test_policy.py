from launch.policy import RestartPolicy, RestartVerdict


def test_rollout_and_ps_restart_until_the_budget_is_spent() -> None:
    policy = RestartPolicy(max_restarts=2, window_s=10)
    assert policy.decide("rollout-0", "rollout", 0.0, shutting_down=False)[0] is RestartVerdict.RESTART
    assert policy.decide("rollout-0", "rollout", 1.0, shutting_down=False)[0] is RestartVerdict.RESTART
    verdict, reason = policy.decide("rollout-0", "rollout", 2.0, shutting_down=False)
    assert verdict is RestartVerdict.END_RUN and "2 times" in reason
    assert policy.decide("ps-1", "ps", 2.0, shutting_down=False)[0] is RestartVerdict.RESTART


def test_old_restarts_leave_the_window() -> None:
    policy = RestartPolicy(max_restarts=1, window_s=10)
    assert policy.decide("ps-0", "ps", 0.0, shutting_down=False)[0] is RestartVerdict.RESTART
    assert policy.decide("ps-0", "ps", 11.0, shutting_down=False)[0] is RestartVerdict.RESTART


def test_the_router_and_the_coordinator_restart_and_an_unknown_role_ends_the_run() -> None:
    policy = RestartPolicy(max_restarts=1, window_s=10)
    assert policy.decide("router", "router", 0.0, shutting_down=False)[0] is RestartVerdict.RESTART
    assert policy.decide("coordinator", "coordinator", 0.0, shutting_down=False)[0] is RestartVerdict.RESTART
    verdict, reason = policy.decide("coordinator", "coordinator", 1.0, shutting_down=False)
    assert verdict is RestartVerdict.END_RUN and "1 times" in reason
    verdict, reason = policy.decide("oracle", "oracle", 0.0, shutting_down=False)
    assert verdict is RestartVerdict.END_RUN and "no restart policy" in reason


def test_deaths_during_shutdown_are_ignored() -> None:
    assert RestartPolicy().decide("router", "router", 0.0, shutting_down=True)[0] is RestartVerdict.IGNORE
