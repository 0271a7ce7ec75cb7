"""specls: a code-completion language server built around speculative decoding."""

__version__ = "0.1.0"
