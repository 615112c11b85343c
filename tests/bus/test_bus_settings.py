"""Bus settings come from the run's configuration, in the units the bus classes take."""

from __future__ import annotations

from bus.settings import BusSettings
from psrl.config import load_config


def test_settings_follow_the_config() -> None:
    config = load_config(None, ["bus.hwm=5000", "bus.max_message_mib=8", "run.fsync=always", "bus.request_retries=0"])
    settings = BusSettings.from_config(config)
    assert settings.options.hwm == 5000 and settings.options.curve is None
    assert settings.max_message_bytes == 8 * 1024 * 1024
    assert settings.segment_bytes == config.bus.log_segment_mib * 1024 * 1024
    assert (settings.fsync, settings.request_retries) == ("always", 0)
    assert settings.array_frame_bytes == config.bus.array_frame_bytes
