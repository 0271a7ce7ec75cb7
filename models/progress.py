"""Progress of preparing a model (resolve, download, convert): one small protocol, a console bar.

A reporter is called with a stage (one of ``STAGES``), the fraction of that stage done (0..1) and a
short message ("model.safetensors", "quantizing model.onnx to 8 bits"). The console bar draws it on
stderr; the LSP server (``$/progress``) and the team service (``/healthz``) implement the same
protocol.

>>> seen = []
>>> report = RecordingProgress(seen)
>>> report("downloading", 0.5, "model.safetensors")
>>> seen
[('downloading', 0.5, 'model.safetensors')]
>>> describe("converting", 0.25, "quantizing")
'converting 25%: quantizing'
>>> status_text("downloading", 0.434, "model.safetensors"), status_text("converting", 0.7, "quantizing")
('downloading 43%', 'converting: quantizing')
>>> preparing_stage("downloading 43%"), preparing_stage("loading target model")
('downloading', None)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

# resolving: asking the hub which commit and files; downloading: bytes of the files; converting: the
# export (torch -> ONNX, verify, quantize); ready: the model directory is in the cache
STAGES = ("resolving", "downloading", "converting", "ready")
PREPARING = STAGES[:3]  # the stages of a model being prepared (not yet in the cache)


class Progress(Protocol):
    """Where progress goes: ``stage`` in STAGES, ``fraction`` of that stage done, a short message."""

    def __call__(self, stage: str, fraction: float, message: str = "") -> None: ...


def no_progress(stage: str, fraction: float, message: str = "") -> None:
    """A reporter that drops everything."""


def describe(stage: str, fraction: float, message: str = "") -> str:
    """One line for a report, as editors and logs show it ("downloading 43%: model.safetensors")."""
    text = f"{stage} {100 * max(0.0, min(1.0, fraction)):.0f}%"
    return f"{text}: {message}" if message else text


def status_text(stage: str, fraction: float, message: str = "") -> str:
    """The few words a status line shows (an editor's status bar, ``/healthz``): the download's
    percentage ("downloading 43%"), the conversion's step ("converting: quantizing")."""
    if stage == "downloading":
        return f"downloading {100 * max(0.0, min(1.0, fraction)):.0f}%"
    if stage in ("converting", "ready"):
        return f"{stage}: {message}" if message else stage
    return f"{stage} {message}".strip()


def preparing_stage(text: str) -> str | None:
    """The stage in PREPARING a ``status_text`` line is at, or None for any other message (loading)."""
    word = text.split(" ", 1)[0].rstrip(":")
    return word if word in PREPARING else None


class RecordingProgress:
    """Appends every report to a list (tests; a caller that shows progress later)."""

    def __init__(self, into: list[tuple[str, float, str]]) -> None:
        self.into = into

    def __call__(self, stage: str, fraction: float, message: str = "") -> None:
        self.into.append((stage, fraction, message))


class ConsoleProgress:
    """A one-line bar on ``stream`` (stderr): redrawn in place on a terminal, a line per stage change
    (and at most one every ``interval`` seconds) elsewhere, so logs stay short."""

    def __init__(
        self,
        stream: TextIO | None = None,
        width: int = 30,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.interval = interval
        self.clock = clock
        self.tty = self.stream.isatty()
        self._stage = ""
        self._last = -float("inf")
        self._open = False  # a redrawn line is on the terminal, not yet ended

    def __call__(self, stage: str, fraction: float, message: str = "") -> None:
        fraction = max(0.0, min(1.0, fraction))
        now = self.clock()
        new_stage = stage != self._stage
        if not self.tty and not new_stage and fraction < 1.0 and now - self._last < self.interval:
            return
        if self.tty and not new_stage and fraction < 1.0 and now - self._last < 0.1:
            return  # redrawing faster than a terminal can show costs time for nothing
        filled = int(round(self.width * fraction))
        line = f"[{'#' * filled}{'-' * (self.width - filled)}] {describe(stage, fraction, message)}"
        if self.tty:
            if new_stage and self._open:
                self.stream.write("\n")
            self.stream.write(f"\r\033[K{line}")
            self._open = fraction < 1.0 and stage != "ready"
            if not self._open:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._stage, self._last = stage, now


def export_progress(progress: Progress) -> Callable[[str, float], None]:
    """The ``progress(message, fraction)`` callback ``specls.models.export.export_model`` takes, as
    ``converting`` reports to ``progress``.

    >>> seen = []
    >>> export_progress(RecordingProgress(seen))("tracing to ONNX", 0.15)
    >>> seen
    [('converting', 0.15, 'tracing to ONNX')]
    """

    def report(message: str, fraction: float) -> None:
        progress("converting", fraction, message)

    return report


__all__ = [
    "PREPARING",
    "STAGES",
    "ConsoleProgress",
    "Progress",
    "RecordingProgress",
    "describe",
    "export_progress",
    "no_progress",
    "preparing_stage",
    "status_text",
]
