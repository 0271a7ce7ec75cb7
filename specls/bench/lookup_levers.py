"""``bench real``'s lookup levers: prompt lookup over the open buffers only (``lookup``), plus the
task's workspace (``lookup+workspace``), plus a code datastore (``lookup+datastore``), and the draft
model with all of them (``hybrid+datastore``), the target's feature head with all the lookup sources
(``lookup+datastore+head``) and alone (``head``: no lookup; what the head accepts by position); each
source's memory and start-up cost.

A workspace is a novel task's package less the files that hold a task (``novel_tasks.workspace_of``),
indexed as the engine's workspace index does (``build_workspace``); the datastore is the one
``specls datastore build`` makes, built here when missing. Both reach the engines as datastore folders
(``EngineSettings.datastore``, the workspace first). Each lever learns in drafting-policy states of
its own, so the levers teach each other and ``lookup`` nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from specls.decoder.planned import PolicyState

LEVERS = ("lookup+workspace", "lookup+datastore", "hybrid+datastore", "lookup+datastore+head", "head")


def _fresh(policy: PolicyState) -> PolicyState:
    """A policy state with ``policy``'s costs and cost learner as they are now, nothing learned shared."""
    return PolicyState(costs=policy.costs, learner=copy.deepcopy(policy.learner))


class LookupLevers:
    """The lever engines (per method and workspace) over one loaded engine's models."""

    def __init__(self, engine: Any, base: Any, datastore: str) -> None:
        self._engine = engine
        self._base = base  # EngineSettings of the benchmark's engines
        self._datastore_spec = datastore
        self._datastore: str | None = None
        self._workspaces: dict[Path, str] = {}
        self._engines: dict[tuple[str, Path | None], Any] = {}
        self._models: dict[str, Any] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="specls-bench-levers-"))
        self.costs: dict[str, dict[str, object]] = {}  # source -> what it holds and cost to make

    def _measured(self, label: str, make: Any) -> Any:
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            store = make()
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        if store is not None:
            self.costs[label] = {
                **store.stats().as_dict(),
                "start_s": round(time.perf_counter() - t0, 2),
                "peak_build_mib": round(peak / 2**20, 1),
            }
        return store

    def datastore(self) -> str:
        """The datastore's folder: opened from the cache, else built there now (its cost recorded)."""
        if self._datastore is None:
            from specls.datastore_cache import (
                build_datastore,
                corpus_files,
                corpus_name,
                datastore_dir,
                open_datastore,
                tokenizer_key,
            )

            tok = self._engine.models.tokenizer
            folder = datastore_dir(self._datastore_spec, tokenizer_key(tok))
            store = self._measured("datastore", lambda: open_datastore(self._datastore_spec, tok))
            if store is None:

                def encode_batch(texts: list[str]) -> list[list[int]]:
                    return [e.ids for e in tok.hf.encode_batch(texts, add_special_tokens=False)]

                def build() -> Any:
                    files = corpus_files(self._datastore_spec)
                    return build_datastore(files, encode_batch, corpus_name(self._datastore_spec))[0]

                store = self._measured("datastore (built now)", build)
                store.save(folder, {"corpus": self._datastore_spec, "tokenizer": tokenizer_key(tok)})
            self._datastore = str(folder)
        return self._datastore

    def workspace(self, package: Path, exclude: list[Path]) -> str:
        """The package's workspace (less ``exclude``) as a datastore folder, built once per package."""
        if package not in self._workspaces:
            from specls.workspace_index import build_workspace, workspace_files

            tok = self._engine.models.tokenizer
            store = self._measured(
                f"workspace {package.name}",
                lambda: build_workspace(workspace_files(package, exclude=exclude), tok),
            )
            folder = self._dir / f"workspace-{package.name}"
            store.save(folder)
            self._workspaces[package] = str(folder)
        return self._workspaces[package]

    def engine(self, method: str, package: Path | None, exclude: list[Path]) -> Any:
        """The engine of a lever ``method`` for a task of ``package`` (None: no workspace)."""
        key = (method, package)
        if key not in self._engines:
            folders = [self.workspace(package, exclude)] if package is not None else []
            if "+datastore" in method:
                folders.append(self.datastore())
            hybrid = method.startswith("hybrid")
            if method not in self._models:
                m = self._engine.models
                self._models[method] = dataclasses.replace(
                    m, policy=_fresh(m.policy), lookup_policy=_fresh(m.lookup_policy)
                )
            settings = dataclasses.replace(
                self._base,
                draft_model=hybrid and self._base.draft_model,
                datastore=",".join(folders) or None,
                feature_head=method.endswith("head"),
                lookup=method != "head",
            )
            from specls.engine import OnnxEngine

            self._engines[key] = OnnxEngine(settings, self._models[method])
        return self._engines[key]

    def report(self) -> list[str]:
        """One line per source: tokens, memory (mapped), time to make or open, build peak; the feature
        head's cost per guess and what each head lever's policy learned."""
        lines = [
            f"lookup source {label}: {c['tokens']} tokens from {c['documents']} files, {c['mib']} MiB, "
            f"ready in {c['start_s']} s (peak {c['peak_build_mib']} MiB while building)"
            for label, c in self.costs.items()
        ]
        head = self.head_report()
        if head:
            lines.append(f"feature head: {head}")
        return lines

    def head_report(self) -> dict[str, object]:
        """The feature head's description and guess cost against a one-token target pass (as timed at
        load, what the policy charges), and the head levers' learned acceptance by position."""
        parts = self._engine.models.head
        if parts is None:
            return {}
        out: dict[str, object] = dict(parts.info)
        for method, models in self._models.items():
            if method.endswith("head"):
                snap = models.lookup_policy.snapshot()
                out[method] = {k: snap[k] for k in ("choices", "head_accept", "lookup_accept")}
        return out
