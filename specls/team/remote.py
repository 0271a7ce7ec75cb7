"""``RemoteEngine``: the Engine protocol over an OpenAI-compatible ``/v1/completions`` API (vLLM,
SGLang, llama.cpp's server, or another specls running ``specls serve-engine``).

specls stays the editor-facing front end: the LSP layer, text-level stops, cancellation and caching
run here, the model runs there.

- Prompt: either the API's ``suffix`` field (servers that do fill-in-the-middle themselves, such as
  ``specls serve-engine``) or a FIM template filled in here (``QWEN_FIM`` for vLLM/llama.cpp serving a
  Qwen2.5-Coder base model, whose completions endpoint has no ``suffix``). Prefix/suffix are clipped to
  a character budget.
- Streaming: Server-Sent Events; the text-level ``stop`` runs on every chunk and closes the stream as
  soon as the completion is finished (the HTTP side is ``specls.team.remote_http``).
- Cancellation: a watcher polls the cancel check and shuts the socket down, which aborts the HTTP
  stream (the server sees the disconnect and stops generating).
- Caching: an LRU of finished completions per (prefix, suffix, max_tokens), and "typed-ahead" reuse:
  when the user typed exactly the start of the last completion, the rest of it is the answer
  (greedy decoding would produce the same continuation) without a round trip.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from specls.api import (
    CompletionRequest,
    CompletionResult,
    EngineError,
    NextEditRequest,
    NextEditResult,
    no_next_edit,
)
from specls.decoder.api import CancelCheck, DecodeResult, DrafterStats, never_cancelled
from specls.next_edit.edits import suggested_edits
from specls.next_edit.layouts import get_layout, layout_for_model
from specls.next_edit.request_prompt import render_edit
from specls.next_edit.rewrite_end import RewriteEnd
from specls.next_edit.settings import NextEditSettings
from specls.team.remote_http import CancelWatcher, NotYet, RemoteHttp, Reply

log = logging.getLogger(__name__)

QWEN_FIM = "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
QWEN_STOPS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>")


@dataclass(frozen=True)
class RemoteSettings:
    base_url: str  # http(s)://host:port, with or without a trailing /v1
    model: str = ""  # sent as "model"; "" = the first model the server lists
    api_key: str | None = None  # sent as "Authorization: Bearer ..." (never logged)
    fim_template: str | None = None  # None = send the API's suffix field; else e.g. QWEN_FIM
    stop: tuple[str, ...] = ()  # stop strings sent to the server
    stream: bool = True
    temperature: float = 0.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0  # longest silence from the server before giving up
    max_prefix_chars: int = 16_000
    max_suffix_chars: int = 4_000
    cache_size: int = 256
    send_doc_id: bool = True  # "user" = hash of the document id (lets serve-engine reuse its KV)
    cancel_poll_s: float = 0.02
    # A back end that is still starting answers 503 "Loading model" (llama-server, vLLM) or refuses the
    # connection for seconds to minutes (a big model, vLLM compiling CUDA graphs): load() retries with
    # backoff for this long before it fails for good. 0 = one attempt.
    load_wait_s: float = 300.0
    retry_initial_s: float = 0.5  # first wait between attempts, doubled each time ...
    retry_max_s: float = 10.0  # ... up to this


def backoff_delay(attempt: int, initial_s: float, max_s: float) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): ``initial_s`` doubled per attempt,
    capped at ``max_s``. E.g. initial 0.5, max 10: 0.5, 1, 2, 4, 8, 10, 10, ..."""
    if attempt < 0 or initial_s <= 0:
        return max(0.0, initial_s)
    return float(min(max_s, initial_s * 2 ** min(attempt, 62)))


def fill_template(template: str, prefix: str, suffix: str) -> str:
    """``template`` with ``{prefix}``/``{suffix}`` substituted literally (code may contain braces)."""
    head, sep, rest = template.partition("{prefix}")
    if not sep:
        raise ValueError("FIM template must contain {prefix}")
    mid, sep2, tail = rest.partition("{suffix}")
    if not sep2:
        return head + prefix + rest
    return head + prefix + mid + suffix + tail


@dataclass
class _Cached:
    text: str  # what the server produced (before our text-level stop)
    complete: bool  # the server finished on its own (not cut by our stop / cancel)
    tokens: int


class RemoteEngine:
    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self._http = RemoteHttp(settings)
        self._model = settings.model
        self._ready = False
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str, int], _Cached] = OrderedDict()
        self._last: dict[str, tuple[str, str, _Cached]] = {}  # doc -> (prefix, suffix, result)
        self._docs: set[str] = set()
        self._closing = threading.Event()
        self._load_state = "new"  # new | waiting for back end | ready | failed
        self._load_attempts = 0
        self._last_load_error = ""
        self._stats = {
            "requests": 0,
            "cache_hits": 0,
            "type_ahead_hits": 0,
            "aborted_streams": 0,
            "tokens": 0,
        }

    @property
    def url(self) -> str:
        return self._http.url

    # -- Engine protocol -------------------------------------------------------------------------

    def load(self, progress: Callable[[str, float], None] | None = None) -> None:
        """Check the back end (``/v1/models``) and pick the model. While it is starting (a retryable
        HTTP status, or no connection) retry with backoff for ``load_wait_s``, reporting "waiting for
        back end" through ``progress``; then fail with an EngineError. ``close()`` stops the wait."""
        s = self.settings
        if progress is not None:
            progress(f"connecting to {self.url}", 0.0)
        deadline = time.monotonic() + max(0.0, s.load_wait_s)
        attempt = 0
        while True:
            try:
                self._probe()
                break
            except NotYet as exc:
                reason = str(exc)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                with self._lock:
                    self._load_state = "failed"
                waited = f" after {attempt + 1} attempts in {s.load_wait_s:g} s" if attempt else ""
                raise self._http.fail(f"back end not ready{waited}", reason)
            delay = min(backoff_delay(attempt, s.retry_initial_s, s.retry_max_s), remaining)
            attempt += 1
            message = f"waiting for back end at {self.url} ({reason}); retry {attempt} in {delay:.1f} s"
            with self._lock:
                self._load_state = "waiting for back end"
                self._load_attempts = attempt
                self._last_load_error = reason
            (log.warning if attempt == 1 else log.info)("%s", message)
            if progress is not None:
                progress(message, 0.0)
            if self._closing.wait(delay):
                raise EngineError(f"remote engine at {self.url}: stopped while waiting for the back end")
        with self._lock:
            self._load_state = "ready"
        self._ready = True
        if progress is not None:
            progress(f"remote engine ready ({self._model or 'default model'})", 1.0)

    def close(self) -> None:
        """Stop a load that is waiting for the back end (a server shutting down)."""
        self._closing.set()

    def _probe(self) -> None:
        """One ``GET /v1/models``, picking the model; raises NotYet (retryable) or EngineError (permanent)."""
        ids = self._http.list_models()
        if ids is None:  # a server without /v1/models still may serve completions
            return
        if not self._model and ids and isinstance(ids[0], str):
            self._model = ids[0]
        elif self._model and ids and self._model not in ids:
            raise self._http.fail("listing models", f"model {self._model!r} not served (has {ids})")

    @property
    def ready(self) -> bool:
        return self._ready

    def update_document(self, doc_id: str, text: str) -> None:
        with self._lock:
            self._docs.add(doc_id)

    def close_document(self, doc_id: str) -> None:
        with self._lock:
            self._docs.discard(doc_id)
            self._last.pop(doc_id, None)

    def next_edit(self, request: NextEditRequest, cancelled: CancelCheck = never_cancelled) -> NextEditResult:
        """The edit prompt sent to the back end as a plain completion (its own speculation applies),
        in the layout ``request.layout`` or the one the served model's name implies; the answer is
        parsed and diffed as the in-process engine does (``specls.next_edit``)."""
        if cancelled():
            return no_next_edit(request, "cancelled", provider="remote")
        try:
            layout = get_layout(request.layout or layout_for_model(self._model))
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        edit = NextEditSettings()
        r = render_edit(request, layout, edit)
        # about three characters a token: the region's length again and half as much, and some slack
        budget = request.max_tokens or len(r.region_text) // 2 + 32
        inner = CompletionRequest(doc_id=request.doc_id, prefix=r.prompt, suffix="", max_tokens=budget)
        body = {**self._body(inner), "stop": list(layout.end_markers)}
        body.pop("suffix", None)
        body["prompt"] = r.prompt  # the layout's prompt as it is, no FIM template around it
        t0 = time.perf_counter()
        watch = CancelWatcher(cancelled, self.settings.cancel_poll_s)
        reply = Reply()
        self._http.complete(body, inner.stop, watch, reply)
        if watch.aborted.is_set():
            return no_next_edit(request, "cancelled", provider="remote")
        # the server leaves out the stop string it ended at: "stop" is an ended output
        ended = reply.finish == "stop"
        ends = RewriteEnd.of(layout, r.region_text, r.after, edit.max_added_lines)
        rewritten, why = ends.read(reply.text + (layout.end_markers[0] if ended else ""), eos=False)
        decode = DecodeResult(tokens=[], decode_ms=(time.perf_counter() - t0) * 1000)
        result = NextEditResult(
            (), r.region, rewritten, reply.tokens(), reply.stop_reason(), decode=decode, layout=layout.name
        )
        if rewritten is None:
            return replace(result, dropped=why, provider="remote")
        edits, dropped, undone = suggested_edits(
            request.text, r.region, r.region_text, rewritten, r.last_edit
        )
        return replace(result, edits=tuple(edits), dropped=dropped, undone=undone, provider="remote")

    def interrupt(self) -> None:
        """Nothing to stop here: a back end's request ends when its HTTP request is cancelled."""

    def stats(self) -> dict[str, object]:
        http_requests, errors = self._http.counts()
        with self._lock:
            counts = dict(self._stats)
            return {
                "engine": "remote",
                "url": self.url,
                "model": self._model,
                "state": self._load_state,
                "load_retries": self._load_attempts,
                "last_load_error": self._last_load_error,
                "open_documents": len(self._docs),
                "cached_completions": len(self._cache),
                "requests": counts.pop("requests"),
                "http_requests": http_requests,
                "errors": errors,
                **counts,
            }

    def _from_cache(self, request: CompletionRequest) -> CompletionResult | None:
        key = (request.prefix, request.suffix, request.max_tokens)
        reuse = False
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                text, complete = hit.text, hit.complete
            else:
                last = self._last.get(request.doc_id)
                if last is None:
                    return None
                old_prefix, old_suffix, old = last
                typed = request.prefix[len(old_prefix) :]
                if not (
                    request.suffix == old_suffix
                    and request.prefix.startswith(old_prefix)
                    and typed
                    and old.text.startswith(typed)
                    and len(old.text) > len(typed)
                ):
                    return None
                text, complete, reuse = old.text[len(typed) :], old.complete, True
        keep = request.stop(text) if request.stop is not None else None
        if keep is None and not complete:
            return None  # the cached text was cut short; it may not reach this request's stop
        out = text if keep is None else text[:keep]
        if not out:
            return None
        with self._lock:
            self._stats["type_ahead_hits" if reuse else "cache_hits"] += 1
            self._stats["requests"] += 1
        return CompletionResult(
            text=out,
            tokens=0,
            stop_reason="stop" if keep is not None else "max_tokens",
            cache_hit=not reuse,
            type_ahead=reuse,
            provider="remote",
        )

    def _body(self, request: CompletionRequest) -> dict[str, object]:
        s = self.settings
        prefix = request.prefix[-s.max_prefix_chars :] if s.max_prefix_chars else request.prefix
        suffix = request.suffix[: s.max_suffix_chars] if s.max_suffix_chars else request.suffix
        body: dict[str, object] = {
            "max_tokens": int(request.max_tokens),
            "temperature": s.temperature,
            "stream": s.stream,
        }
        if self._model:
            body["model"] = self._model
        if s.fim_template:
            body["prompt"] = fill_template(s.fim_template, prefix, suffix)
        else:
            body["prompt"] = prefix
            body["suffix"] = suffix
        if s.stop:
            body["stop"] = list(s.stop)
        if s.send_doc_id:
            body["user"] = hashlib.sha256(request.doc_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]
        return body

    def complete(
        self, request: CompletionRequest, cancelled: CancelCheck = never_cancelled
    ) -> CompletionResult:
        if request.max_tokens <= 0:
            return CompletionResult(text="", stop_reason="max_tokens", provider="remote")
        cached = self._from_cache(request)
        if cached is not None:
            return cached
        if cancelled():
            return CompletionResult(text="", stop_reason="cancelled", cancelled=True, provider="remote")
        t0 = time.perf_counter()
        watch = CancelWatcher(cancelled, self.settings.cancel_poll_s)
        reply = Reply()
        self._http.complete(self._body(request), request.stop, watch, reply)
        if watch.aborted.is_set():
            with self._lock:
                self._stats["aborted_streams"] += 1
                self._stats["requests"] += 1
            return CompletionResult(
                text="", tokens=reply.chunks, stop_reason="cancelled", cancelled=True, provider="remote"
            )
        tokens = reply.tokens()
        self._remember(request, _Cached(reply.raw, reply.complete, tokens))
        return _with_remote_stats(
            CompletionResult(
                text=reply.text,
                tokens=tokens,
                stop_reason=reply.stop_reason(),
                decode=DecodeResult(tokens=[], decode_ms=(time.perf_counter() - t0) * 1000),
                provider="remote",
            ),
            reply.extra,
        )

    def _remember(self, request: CompletionRequest, entry: _Cached) -> None:
        """Count the request and keep its answer for the LRU cache and typed-ahead reuse."""
        with self._lock:
            self._stats["requests"] += 1
            self._stats["tokens"] += entry.tokens
            key = (request.prefix, request.suffix, request.max_tokens)
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > max(0, self.settings.cache_size):
                self._cache.popitem(last=False)
            self._last[request.doc_id] = (request.prefix, request.suffix, entry)


def _with_remote_stats(result: CompletionResult, extra: dict[str, object]) -> CompletionResult:
    """Copy the decode statistics a specls serve-engine attaches (``"specls"`` field) into the result."""

    def num(key: str) -> int:
        v = extra.get(key)
        return int(v) if isinstance(v, int | float) else 0

    decode = result.decode if result.decode is not None else DecodeResult(tokens=[])
    result.decode = decode
    decode.target_passes = num("target_passes")
    decode.drafted = num("drafted")
    decode.accepted = num("accepted")
    decode.prefill_tokens = num("prefill_tokens")
    result.prefix_reused_tokens = num("prefix_reused_tokens")
    per = extra.get("per_drafter")
    if isinstance(per, dict):
        for name, s in per.items():
            if isinstance(s, dict):
                decode.per_drafter[str(name)] = DrafterStats(
                    drafted=int(s.get("drafted", 0)),
                    accepted=int(s.get("accepted", 0)),
                    proposals=int(s.get("proposals", 0)),
                )
    return result
