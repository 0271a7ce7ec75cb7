"""The drafting policy's pass costs, kept per machine so that a load measures them once.

``decoder.planned.calibrate`` times a pair's passes at load: for a 1.5B pair on a CPU, a good part of
the load, paid again by every `specls complete` and every server start.
The costs are ratios to a one-token target pass, so they depend on the model files, the runtime
settings, onnxruntime and the CPU, and not on the minute they were taken: this file keeps them in
``$XDG_CACHE_HOME/specls/pass-costs.json`` (default ``~/.cache/specls``), one entry per key, and the next
load with the same key reads them instead. Delete the file to measure again.

What may go wrong with the file is never an error: a missing, unreadable, corrupt or unwritable cache
is logged and the costs are measured as without one. A stored entry whose numbers are not a valid
``PassCosts`` is ignored. The key names each model file with its size and modification time, so a
re-export into the same directory measures again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specls.decoder.policy import PassCosts

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when calibrate() measures differently: entries of another format are not read
MAX_ENTRIES = 32  # oldest dropped beyond this (one entry per model pair x threads x provider)


def default_path() -> Path:
    """``$XDG_CACHE_HOME/specls/pass-costs.json``, ``~/.cache/specls/pass-costs.json`` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specls" / "pass-costs.json"


def model_fingerprint(model_dir: Path) -> list[list[Any]]:
    """Every file under ``model_dir`` as [relative path, size, mtime_ns], sorted.

    >>> model_fingerprint(Path("/nonexistent"))
    []
    """
    if not model_dir.is_dir():
        return []
    rows: list[list[Any]] = []
    for p in sorted(model_dir.rglob("*")):
        if p.is_file():
            st = p.stat()
            rows.append([p.relative_to(model_dir).as_posix(), st.st_size, st.st_mtime_ns])
    return rows


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict[str, Any]:
    """What besides the models and settings moves pass-cost ratios: the CPU, its count, onnxruntime."""
    try:
        import onnxruntime

        ort = str(onnxruntime.__version__)
    except ImportError:  # pragma: no cover - the serving path always has it
        ort = "none"
    return {"cpu": _cpu_name(), "cpus": os.cpu_count(), "machine": platform.machine(), "onnxruntime": ort}


def costs_key(
    target_dir: Path, draft_dir: Path | None, settings: Mapping[str, Any], facts: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON-able key of one calibration: the model files, the runtime ``settings`` (threads,
    provider, ...) and the ``facts`` of the machine (``machine_facts()``)."""
    return {
        "format": FORMAT,
        "target": [str(target_dir.resolve()), model_fingerprint(target_dir)],
        "draft": None if draft_dir is None else [str(draft_dir.resolve()), model_fingerprint(draft_dir)],
        "settings": dict(settings),
        "machine": dict(facts),
    }


def _digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _number(x: object) -> float | None:
    """``x`` as a finite, non-negative float, else None (a bool is not a number here)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0:
        return float(x)
    return None


def _costs_from(entry: object) -> PassCosts | None:
    """A stored entry's costs, or None where they are not what ``calibrate`` can measure."""
    c = entry.get("costs") if isinstance(entry, dict) else None
    if not isinstance(c, dict) or not isinstance(c.get("verify"), list) or not c["verify"]:
        return None
    verify = [_number(v) for v in c["verify"]]
    step, catchup = _number(c.get("step")), _number(c.get("catchup"))
    if step is None or catchup is None or not all(v is not None and v > 0 for v in verify):
        return None
    return PassCosts(verify=tuple(v for v in verify if v is not None), step=step, catchup=catchup)


class PassCostsCache:
    """A JSON file of pass costs by key. ``get`` and ``put`` never raise on the file's account."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("pass-costs cache %s unreadable (%s); measuring", self.path, exc)
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            logger.warning("pass-costs cache %s is not JSON (%s); it will be rewritten", self.path, exc)
            return {}
        entries = data.get("entries") if isinstance(data, dict) else None
        return entries if isinstance(entries, dict) else {}

    def get(self, key: Mapping[str, Any]) -> PassCosts | None:
        entry = self._read().get(_digest(key))
        costs = _costs_from(entry)
        if entry is not None and costs is None:
            logger.warning("pass-costs cache %s: an invalid entry for this pair; measuring", self.path)
        return costs

    def put(self, key: Mapping[str, Any], costs: PassCosts) -> None:
        entries = self._read()

        def seq(entry: object) -> int:  # the order entries were written in (clock ties cannot reorder it)
            n = entry.get("seq") if isinstance(entry, dict) else None
            return n if isinstance(n, int) and not isinstance(n, bool) else 0

        entries[_digest(key)] = {
            "seq": max((seq(e) for e in entries.values()), default=0) + 1,
            "measured": time.time(),
            "key": dict(key),
            "costs": {"verify": list(costs.verify), "step": costs.step, "catchup": costs.catchup},
        }
        if len(entries) > MAX_ENTRIES:
            entries = dict(sorted(entries.items(), key=lambda item: seq(item[1]))[-MAX_ENTRIES:])
        text = json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # written whole then renamed: two servers starting at once each leave a whole file
            fd, tmp = tempfile.mkstemp(prefix=".pass-costs-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            logger.warning("pass-costs cache %s not written (%s)", self.path, exc)

    def get_or_measure(self, key: Mapping[str, Any], measure: Callable[[], PassCosts]) -> PassCosts:
        """The cached costs for ``key``, else ``measure()``'s, stored for the next load."""
        cached = self.get(key)
        if cached is not None:
            logger.info("drafting policy costs from %s", self.path)
            return cached
        costs = measure()
        self.put(key, costs)
        return costs
