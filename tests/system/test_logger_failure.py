"""A logger whose log cannot be written (a full disk) dies of it: the run never ends "finished"
with a truncated event log."""

from __future__ import annotations

import pytest

from tests.system.launch_helpers import make_supervisor

pytestmark = pytest.mark.system

FULL_DISK_LOGGER = "tests.fakes.actors:FullDiskLogger"


def test_a_logger_whose_disk_fills_mid_run_dies_and_the_run_fails_when_restarts_cannot_help(tmp_path) -> None:
    sup = make_supervisor(tmp_path, {"coordinator": {"finish_after_s": 60}})
    sup.actor_options["logger"] = {"actor_class": FULL_DISK_LOGGER, "disk_full_after_s": 2.0}
    sup.policy.max_restarts = 1
    code = sup.run()
    assert code == 1
    assert sup.end_reason is not None and sup.end_reason.startswith("logger died"), sup.end_reason
    assert "No space left on device" in sup.end_reason
    assert sup.num_restarts == {"logger": 1}  # restarted once (the disk might have had room again)
    assert sup.run_dir.read_state()["status"] == "failed"


def test_a_logger_that_cannot_write_the_logs_end_fails_a_finished_run(tmp_path) -> None:
    sup = make_supervisor(tmp_path, {"coordinator": {"finish_after_s": 1.5}})
    sup.actor_options["logger"] = {"actor_class": FULL_DISK_LOGGER, "disk_full_on_close": True}
    code = sup.run()
    assert code == 1
    assert sup.end_reason is not None and "the event log is incomplete: logger failed" in sup.end_reason
    assert sup.run_dir.read_state()["status"] == "failed"
    assert "No space left on device" in sup.run_dir.log_file("logger").read_text()
