"""Type-ahead: typing the beginning of the last finished suggestion answers its rest with zero model
calls (``EngineSettings.type_ahead``)."""

from __future__ import annotations

import logging

from specls.api import CompletionRequest, CompletionResult
from specls.completion_cache import FINISHED
from specls.decoder.reuse import PreviousCompletion

logger = logging.getLogger(__name__)


def type_ahead_answer(
    last: PreviousCompletion, request: CompletionRequest, provider: str
) -> CompletionResult | None:
    """The rest of the document's last finished completion ``last`` when the cursor has since typed
    its beginning (same suffix), cut by this request's stop; None when that is not the case, leaves
    nothing to show, is over ``max_tokens``, or may be shorter than this request's answer (the last
    one was cut off by its token budget or another stop, and neither this request's stop nor its
    early stop cuts the rest). The text is the answer to the prompt that produced it."""
    typed = last.typed(request.prefix, request.suffix) if last.stop_reason in FINISHED else None
    if not typed:  # None: not typing through it; 0: the same cursor (the completion cache's case)
        return None
    rest = last.text[typed:]
    partial = False
    try:
        cut = request.stop(rest) if request.stop is not None else None
        if cut is None and last.stop_reason != "eos" and request.early_stop is not None:
            cut = request.early_stop(rest)  # the early answer: the rest is left to a later request
            partial = cut is not None
    except Exception:  # a broken stop function: let the decode path (which guards it) answer
        logger.exception("stop function failed on a type-ahead text")
        return None
    if cut is None and last.stop_reason != "eos":
        return None  # the model would have gone on after `rest`
    text = rest if cut is None else rest[:cut]
    offsets = last.offsets()  # the tokens that made text: ending after `typed`, starting before its end
    ends = zip(offsets, offsets[1:], strict=False)
    n = sum(1 for a, b in ends if b > typed and a < typed + len(text))
    if not text.strip() or n > request.max_tokens:
        return None
    return CompletionResult(
        text=text,
        tokens=n,
        stop_reason="eos" if cut is None else "stop",
        type_ahead=True,
        partial=partial,
        provider=provider,
    )
