"""Converting a downloaded checkpoint (or GGUF file) into a model-cache entry, with the export defaults:
in this process (``convert``), or in a child process (``convert_in_child``).

The child is what a language server over stdio needs: torch and transformers print to stdout, which
there is the LSP stream. The child's stdout and stderr go to a log file in the cache
(``<cache>/.logs/<ID>.log``); its progress comes back on a private pipe as one JSON object a line,
which the parent hands to its progress reporter. The conversion's memory (the torch model, the traced
graph) goes back to the system when the child exits, instead of staying in a long-running server.

>>> parse_line(b'{"stage": "converting", "fraction": 0.5, "message": "quantizing"}')
{'stage': 'converting', 'fraction': 0.5, 'message': 'quantizing'}
>>> parse_line(b"Loading checkpoint shards") is None
True
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from specls.models.model_store import ConvertSettings
from specls.models.progress import Progress, export_progress

from specls.api import EngineError

log = logging.getLogger("specls.models.conversion")  # the same name when run as the child (__main__)


class ConversionError(Exception):
    """The conversion failed; ``str(exc)`` is one line saying why (no traceback)."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def convert(source: str, out: Path, settings: ConvertSettings, progress: Progress) -> None:
    """Convert ``source`` (a checkpoint directory or a .gguf file) into ``out`` with ``settings``,
    here. Raises ConversionError."""
    from specls.models.export import ExportOptions, export_model

    options = ExportOptions(
        dtype=settings.dtype,
        quantize=settings.quantize,
        draft_head=settings.draft_head,
        fim_family=settings.fim_family,
        trust_remote_code=settings.trust_remote_code,
    )
    try:
        export_model(source, out, options, progress=export_progress(progress))
    except EngineError as exc:
        log.info("conversion of %s failed", source, exc_info=True)  # the child's log keeps the details
        raise ConversionError(str(exc)) from None
    except Exception as exc:  # transformers/torch on a corrupt or foreign checkpoint: no traceback
        log.info("conversion of %s failed", source, exc_info=True)
        raise ConversionError(f"{type(exc).__name__}: {_first_line(exc)}") from None


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """A progress or error line of the child, or None for anything else."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def convert_in_child(
    source: str, out: Path, settings: ConvertSettings, progress: Progress, log_path: Path
) -> None:
    """``convert`` in a child process (see the module docstring); its output goes to ``log_path``.
    Raises ConversionError, naming the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job = json.dumps({"source": source, "out": str(out), "settings": settings.as_dict()})
    cmd = [sys.executable, "-m", "specls.models.conversion", job]
    error: str | None = None
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file)
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                msg = parse_line(raw)
                if msg is None:
                    continue
                if "error" in msg:
                    error = str(msg["error"])
                else:
                    progress(str(msg["stage"]), float(msg["fraction"]), str(msg.get("message", "")))
            rc = proc.wait()
        except BaseException:  # the caller gives up (interrupted, a progress reporter failed)
            proc.kill()
            proc.wait()
            raise
    if error is not None:
        raise ConversionError(f"{error} (log: {log_path})")
    if rc != 0:
        how = f"was killed by signal {-rc}" if rc < 0 else f"ended with status {rc}"
        raise ConversionError(f"the conversion process {how} (out of memory?); log: {log_path}")


def _child(argv: list[str]) -> int:
    """The child's side: the job from ``argv[0]``; progress and the error as JSON lines on the stdout
    it was started with, everything else (prints, logs) to stderr, the log file."""
    job = json.loads(argv[0])
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what torch or transformers print lands in the log, not among the progress lines
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def report(stage: str, fraction: float, message: str = "") -> None:
        channel.write(json.dumps({"stage": stage, "fraction": fraction, "message": message}) + "\n")

    try:
        convert(job["source"], Path(job["out"]), ConvertSettings.from_dict(job["settings"]), report)
    except ConversionError as exc:
        log.error("conversion failed: %s", exc)
        channel.write(json.dumps({"error": str(exc)}) + "\n")
        return 1
    return 0


__all__ = ["ConversionError", "convert", "convert_in_child", "parse_line"]

if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
