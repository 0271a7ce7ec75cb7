"""What the engine keeps per document between requests: its target KV cache (and the tokens it
holds), its drafters' own state and its last completion, for the ``kv_documents`` documents used
most recently; and the open buffers' prompt-lookup index (``BufferIndex``).

``update``/``close`` may come from any thread: they touch the states under a short lock, and the
buffer index queues updates that the engine applies before building a prompt (``flush``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from specls.decoder.api import CausalLM, KVCache
from specls.decoder.buffer_index import BufferIndex, ReindexPolicy
from specls.decoder.drafters import DraftModelDrafter, PromptLookupDrafter
from specls.decoder.ngram import common_prefix_len
from specls.decoder.planned import PlannedDrafter
from specls.decoder.reuse import PreviousCompletion
from specls.engine_settings import EngineSettings


@dataclass
class DocState:
    cache: KVCache | None = None
    tokens: list[int] = field(default_factory=list)  # what ``cache`` holds
    draft_drafter: DraftModelDrafter | None = None  # keeps its own draft KV cache across requests
    lookup_drafter: PromptLookupDrafter | None = None  # keeps its context n-gram index
    planned_drafter: PlannedDrafter | None = None  # the policy over those
    last: PreviousCompletion | None = None  # for completion reuse and type-ahead


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

    def get(self, doc_id: str) -> DocState:
        """The document's state (a new one for a document not seen or dropped), now the most recent."""
        with self._lock:
            state = self._states.get(doc_id)
            if state is None:
                state = DocState()
                self._states[doc_id] = state
            self._states.move_to_end(doc_id)
            while len(self._states) > self._keep:
                self._states.popitem(last=False)
            return state

    def update(self, doc_id: str, text: str) -> None:
        if self.buffers is not None:
            self.buffers.update(doc_id, text)

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
