"""Typed configuration of every psrl.* knob, its composition and its validation."""

from psrl.config.loader import available_presets, load_config, to_yaml
from psrl.config.root import Config

__all__ = ["Config", "available_presets", "load_config", "to_yaml"]
