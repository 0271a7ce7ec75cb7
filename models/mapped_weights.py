"""Weights that live in files, not in the process' own memory: what keeps a low-memory export (a GGUF
dequantized to fp32, traced, checked by ONNX Runtime) below the size of its fp32 weights.

- ``WeightFile``: a scratch file of raw arrays written one at a time and read back as read-only
  memory maps (a torch model's parameters are views of it, see ``models.gguf``).
- ``spill_large_initializers``: while transformers' ONNX exporter packs sibling MatMul weights into
  new initializers, each large one goes to a file and is kept as a memory map.
- ``PageEvictor``: a thread that drops the mapped pages of some files from the process (madvise
  ``MADV_DONTNEED``). Pages read from a mapped file stay counted in the process' resident memory until
  dropped, although the kernel could reclaim them at any time; dropping them makes the resident size
  what the export really holds. A dropped page is read again from the page cache (or the disk) on
  its next use, so values never change.

numpy only at import; transformers is imported inside ``spill_large_initializers``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_ALIGN = 64  # bytes: each array starts on a cache line
_MADV_DONTNEED = 4
SPILL_MIN_BYTES = 16 << 20  # smaller packed initializers stay in memory


class WeightFile:
    """Raw arrays appended to ``path`` one at a time (``add`` takes them in row chunks, so a large
    tensor is never whole in memory), then ``arrays()``: read-only memory-mapped views by name."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: Any = self.path.open("wb")
        self._entries: dict[str, tuple[int, tuple[int, ...], np.dtype]] = {}
        self._map: np.memmap | None = None

    def add(self, name: str, shape: Sequence[int], dtype: np.dtype, chunks: Iterator[np.ndarray]) -> None:
        """Append ``name``: ``chunks`` are its rows in order (C order), together of ``shape``."""
        pos = self._file.tell()
        pad = -pos % _ALIGN
        self._file.write(b"\0" * pad)
        offset = pos + pad
        n = 0
        for chunk in chunks:
            c = np.ascontiguousarray(chunk, dtype=dtype)
            self._file.write(c.tobytes())  # through the page cache, not this process' memory
            n += c.size
        want = int(np.prod(shape)) if len(shape) else 1
        if n != want:
            raise ValueError(f"{name}: wrote {n} values, shape {tuple(shape)} holds {want}")
        self._entries[name] = (offset, tuple(int(d) for d in shape), np.dtype(dtype))

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array added, as a read-only view of one memory map of the file (closes the writer)."""
        if not self._file.closed:
            self._file.close()
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        out: dict[str, np.ndarray] = {}
        for name, (offset, shape, dtype) in self._entries.items():
            nbytes = int(np.prod(shape)) * dtype.itemsize if len(shape) else dtype.itemsize
            out[name] = self._map[offset : offset + nbytes].view(dtype).reshape(shape)
        return out

    def close(self) -> None:
        """Close the writer and drop this object's map (views handed out keep it alive until freed)."""
        if not self._file.closed:
            self._file.close()
        self._map = None


class PageEvictor:
    """While entered, drops the mapped pages of some memory maps from this process every ``interval``
    seconds (and on ``evict()``): the maps of ``arrays`` (and those ``add``-ed later), which it keeps
    alive until it exits, and every file mapped from under ``roots`` (found in /proc/self/maps: maps
    someone else owns, e.g. ONNX Runtime's of a graph's external data; the caller keeps them mapped
    while the evictor runs, since an address unmapped and reused between the scan and the madvise
    would be dropped too). Only for read-only use: a dropped page of a private mapping someone wrote
    to would lose the write."""

    def __init__(
        self, roots: Sequence[Path] = (), arrays: Sequence[np.ndarray] = (), interval: float = 0.2
    ) -> None:
        self.roots = tuple(str(Path(r).resolve()) + os.sep for r in roots)
        self.interval = interval
        self._arrays: list[np.ndarray] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._madvise: Any = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._madvise = libc.madvise
            self._madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            self._madvise.restype = ctypes.c_int
        except (OSError, AttributeError):  # not Linux/glibc: nothing to drop, memory is just higher
            log.info("madvise is unavailable: mapped weights stay resident")
        for a in arrays:
            self.add(a)

    def add(self, array: np.ndarray) -> None:
        """Drop ``array``'s pages too (it must be a view of a read-only memory map)."""
        with self._lock:
            self._arrays.append(array)

    def _ranges(self) -> list[tuple[int, int]]:
        page = mmap.PAGESIZE
        out: list[tuple[int, int]] = []
        for a in self._arrays:
            addr = a.ctypes.data
            start = addr - addr % page
            out.append((start, addr + a.nbytes - start))
        if not self.roots:
            return out
        try:
            lines = Path("/proc/self/maps").read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(self.roots):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi - lo))
        return out

    def evict(self) -> None:
        if self._madvise is None:
            return
        with self._lock:
            for addr, length in self._ranges():
                self._madvise(addr, length, _MADV_DONTNEED)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.evict()

    def __enter__(self) -> PageEvictor:
        if self._madvise is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="page-evictor", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.evict()
        with self._lock:
            self._arrays.clear()


@contextlib.contextmanager
def spill_large_initializers(spill_dir: Path, evictor: PageEvictor | None = None) -> Iterator[None]:
    """While entered, transformers' ONNX Runtime fusions keep each new initializer of at least
    ``SPILL_MIN_BYTES`` (the packed Q/K/V and gate/up weights: together about half a model) as a
    read-only memory map of a file in ``spill_dir`` instead of in memory. Same values, names and
    order: the graph is the one the fusions write. Each map is ``add``-ed to ``evictor``."""
    from transformers.exporters import onnxruntime_fusions as fusions

    original = getattr(
        fusions, "_initializer", None
    )  # private to transformers: where packed weights are made
    if original is None:  # another transformers version: the packed weights stay in memory
        log.info("transformers' fusions have no _initializer: packed initializers are not spilled")
        yield
        return
    counter = iter(range(1 << 30))

    def spilled(graph: Any, name: str, array: np.ndarray) -> Any:
        if array.nbytes < SPILL_MIN_BYTES:
            return original(graph, name, array)
        path = Path(spill_dir) / f"init-{next(counter):05d}.bin"
        np.ascontiguousarray(array).tofile(path)
        mapped = np.memmap(path, dtype=array.dtype, mode="r", shape=array.shape)
        del array  # the caller's concatenation is freed once this returns
        if evictor is not None:
            evictor.add(mapped)
        return original(graph, name, mapped)

    fusions._initializer = spilled
    try:
        yield
    finally:
        fusions._initializer = original


__all__ = ["PageEvictor", "SPILL_MIN_BYTES", "WeightFile", "spill_large_initializers"]
