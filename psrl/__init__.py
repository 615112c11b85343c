"""psrl: asynchronous RL post-training for LLMs, built as actors on a ZeroMQ message bus."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("psrl")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
