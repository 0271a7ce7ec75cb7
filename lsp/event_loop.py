"""``post_to_loop``: hand a call from an engine thread to the session's event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def post_to_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """``loop.call_soon_threadsafe`` from an engine thread, dropped once the loop is closed (a
    generation cancelled by a server stopping finishes after its event loop is gone)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # "Event loop is closed"
        logger.debug("event loop closed; dropped %s", getattr(fn, "__name__", fn))
