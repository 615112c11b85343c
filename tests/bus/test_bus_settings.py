"""Bus settings come from the run's configuration, in the units the bus classes take."""

from __future__ import annotations

import pytest

from psrl.config import load_config
from psrl.config.bus_settings import bus_settings
from psrl.errors import ConfigError


def test_settings_follow_the_config() -> None:
    config = load_config(None, ["bus.hwm=5000", "bus.max_message_mib=8", "run.fsync=always"])
    settings = bus_settings(config)
    assert settings.options.hwm == 5000 and settings.options.curve is None
    assert settings.max_message_bytes == 8 * 1024 * 1024
    assert settings.segment_bytes == config.bus.log_segment_mib * 1024 * 1024
    assert settings.fsync == "always"
    assert settings.array_frame_bytes == config.bus.array_frame_bytes


def test_request_reply_settings_are_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="one-way links"):
        load_config(None, ["bus.request_timeout_ms=100"])
