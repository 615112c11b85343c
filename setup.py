"""Packaging beyond pyproject.toml: the presets in configs/ ship inside the wheel as psrl/presets/."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["psrl*", "actors*", "bus*", "launch*"]), "psrl.presets"],
    package_dir={"psrl.presets": "configs"},
    package_data={"psrl.presets": ["*.yaml"]},
)
