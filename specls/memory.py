"""This process' memory: how much is resident, and giving freed memory back to the operating system
(stdlib only, so any layer may import it)."""

from __future__ import annotations

import ctypes
import gc
import resource
from pathlib import Path


def resident_bytes() -> int:
    """This process' resident bytes now (0 where /proc is not there)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def release_freed_memory(collect: bool = False) -> None:
    """``malloc_trim(0)``: return the C heap's free pages of every arena to the OS (glibc; a no-op
    elsewhere). ``collect``: run the garbage collector first, so that dropped torch/onnx/ORT objects
    are freed before the trim. Python's allocator keeps freed blocks for reuse, and glibc keeps freed
    pages, so without this a process that loaded and dropped a model keeps its peak RSS."""
    if collect:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
