"""What the engine keeps per document between requests: its target KV cache (and the tokens it
holds), its drafters' own state and its last completion, for the ``kv_documents`` documents used
most recently; the open buffers' prompt-lookup index (``BufferIndex``); and the lookup sources beyond
the buffers (``StaticLookupSources``: the workspace's files not open, a code datastore).

``update``/``close`` may come from any thread: they touch the states under a short lock, and the
buffer index queues updates that the engine applies before building a prompt (``flush``)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specls.decoder.api import CausalLM, KVCache
from specls.decoder.buffer_index import BufferIndex, ReindexPolicy
from specls.decoder.datastore import StaticSources
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.head_drafter import HeadDrafter
from specls.decoder.ngram import common_prefix_len
from specls.decoder.planned import PlannedDrafter
from specls.decoder.reuse import PreviousCompletion
from specls.engine_settings import EngineSettings
from specls.prompt import TextTokenizer
from specls.workspace_index import WorkspaceIndex, root_of

log = logging.getLogger(__name__)


@dataclass
class DocState:
    cache: KVCache | None = None
    tokens: list[int] = field(default_factory=list)  # what ``cache`` holds
    draft_drafter: DraftModelDrafter | None = None  # keeps its own draft KV cache across requests
    lookup_drafter: PromptLookupDrafter | None = None  # keeps its context n-gram index
    planned_drafter: PlannedDrafter | None = None  # the policy over those
    head_drafter: HeadDrafter | None = None  # the target's feature head, bound to ``cache`` per request
    last: PreviousCompletion | None = None  # for completion reuse and type-ahead
    static: StaticLookupSources | None = None  # the engine's (shared), for this document's lookup


class StaticLookupSources:
    """Prompt lookup's sources beyond the open buffers, in the order it consults them: the
    workspace's files not open (``EngineSettings.workspace``; its root is the git root above the first
    opened file) and the code datastores (``EngineSettings.datastore``, comma-separated). Both need the model's tokenizer,
    so they start with the first request that drafts (``start``): the datastore opens memory-mapped
    (milliseconds), the workspace is indexed in a background thread and joins when done."""

    def __init__(self, settings: EngineSettings) -> None:
        # several datastores: comma-separated, consulted in that order
        self.datastores = [d.strip() for d in (settings.datastore or "").split(",") if d.strip()]
        self.sources = StaticSources(order=("workspace", *self.datastores))
        self.workspace = WorkspaceIndex(self.sources) if settings.workspace else None
        self.root: Path | None = None
        self._looked: set[str] = set()  # documents whose root was looked for
        self._tokenizer: TextTokenizer | None = None
        self._lock = threading.Lock()
        self.open_ms = 0.0

    def saw(self, doc_id: str) -> None:
        """A document was updated: until a root is known, look for one above it (once per document)."""
        with self._lock:
            if self.workspace is None or self.root is not None or doc_id in self._looked:
                return
            self._looked.add(doc_id)
        root = root_of(doc_id)
        if root is None or self.workspace is None:
            return
        with self._lock:  # (start() reads root and tokenizer under it too: one of the two starts it)
            if self.root is not None:
                return
            self.root, tokenizer = root, self._tokenizer
        if tokenizer is not None:
            self.workspace.start(root, tokenizer)

    def start(self, tokenizer: TextTokenizer) -> None:
        """Open the datastores and start indexing the workspace (once; later calls return at once)."""
        with self._lock:
            if self._tokenizer is not None:
                return
            self._tokenizer, root = tokenizer, self.root
        if self.datastores:
            from specls.datastore_cache import open_datastore

            t0 = time.perf_counter()
            for spec in self.datastores:
                self.sources.set(spec, open_datastore(spec, tokenizer))
            self.open_ms = 1e3 * (time.perf_counter() - t0)
        if self.workspace is not None and root is not None:
            self.workspace.start(root, tokenizer)

    def stats(self) -> dict[str, object]:
        """Each source's size and cost (tokens, MiB, build seconds; the workspace's state and files)."""
        out: dict[str, object] = dict(self.sources.stats())
        if self.workspace is not None:
            out["workspace_index"] = self.workspace.stats()
        if self.datastores:
            out["datastore_open_ms"] = round(self.open_ms, 1)
        return out


class DocumentStates:
    """The documents' states, least recently used dropped past ``kv_documents``; iterates doc ids."""

    def __init__(self, settings: EngineSettings) -> None:
        self._lock = threading.Lock()
        self._states: OrderedDict[str, DocState] = OrderedDict()
        self._keep = max(1, settings.kv_documents)
        # the open buffers for prompt lookup (None: lookup off)
        self.buffers: BufferIndex | None = None
        if settings.speculation and settings.lookup:
            self.buffers = BufferIndex(ReindexPolicy(settings.reindex_max_chars, settings.reindex_interval_s))
        # prompt lookup's sources beyond the buffers (None: none asked for, or lookup off)
        self.static: StaticLookupSources | None = None
        if self.buffers is not None and (settings.workspace or settings.datastore):
            self.static = StaticLookupSources(settings)

    def get(self, doc_id: str) -> DocState:
        """The document's state (a new one for a document not seen or dropped), now the most recent."""
        with self._lock:
            state = self._states.get(doc_id)
            if state is None:
                state = DocState(static=self.static)
                self._states[doc_id] = state
            self._states.move_to_end(doc_id)
            while len(self._states) > self._keep:
                self._states.popitem(last=False)
            return state

    def update(self, doc_id: str, text: str) -> None:
        if self.buffers is not None:
            self.buffers.update(doc_id, text)
        if self.static is not None:
            self.static.saw(doc_id)

    def close(self, doc_id: str) -> None:
        with self._lock:
            self._states.pop(doc_id, None)  # frees its KV caches (a running request keeps its own ref)
        if self.buffers is not None:
            self.buffers.close(doc_id)

    def flush(self, encode: Callable[[str], list[int]], force: bool = False) -> None:
        """Apply pending buffer texts to the prompt-lookup index (``BufferIndex.flush``)."""
        if self.buffers is not None:
            self.buffers.flush(encode, force)

    def kv_tokens(self) -> int:
        with self._lock:
            return sum(d.cache.length for d in self._states.values() if d.cache is not None)

    def indexed(self) -> int:
        """Buffers in the prompt-lookup index."""
        return len(self.buffers) if self.buffers is not None else 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._states))


def prefix_cache(target: CausalLM, state: DocState, prompt: Sequence[int], reuse: bool) -> KVCache:
    """The document's target KV cache truncated to its longest common token prefix with ``prompt``
    (only the rest is prefilled), or a new one (``reuse`` off: always a new one)."""
    cache = state.cache
    if cache is None or not reuse:
        cache = target.new_cache()
        state.cache, state.tokens = cache, []
    keep = min(common_prefix_len(state.tokens, prompt) if reuse else 0, cache.length)
    cache.truncate(keep)
    state.tokens = state.tokens[:keep]
    return cache
