"""specls: a code-completion language server built around speculative decoding."""

from importlib.metadata import PackageNotFoundError, version

try:  # the one place the version is written is pyproject.toml
    __version__ = version("specls")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
