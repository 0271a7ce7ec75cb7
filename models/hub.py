"""A model by name: ``resolve_model(spec)`` turns what the user typed into a loadable model directory
(what ``--model DIR`` takes), downloading and converting on first use and caching the result
(``specls.models.model_store``).

What ``spec`` may be:

- a directory: used as is;
- a local ``FILE.gguf``: converted (dequantized by transformers) and cached, keyed by its path, size
  and mtime;
- a hub id ``ORG/NAME``: its safetensors checkpoint downloaded and converted with the export defaults;
- a hub GGUF ``ORG/NAME:TAG``: the ``.gguf`` file of the repo whose name is ``TAG`` or contains it as a
  quantization (``Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q8_0``), downloaded and converted; a repo with
  GGUF files and no safetensors takes its only ``.gguf`` (or its Q8_0 one) without a tag;
- any hub spec may end in ``@REVISION`` (branch, tag or commit); the default is ``main``.

Downloads go through huggingface_hub (``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``, ``HF_TOKEN`` and
``HF_HUB_OFFLINE`` as everywhere else; an interrupted file is fetched again from where it stopped).
A hub spec is found in the cache without asking the hub when its revision is a commit, when
``HF_HUB_OFFLINE`` is set, or when the hub cannot be reached. torch and transformers are imported only
when a conversion is needed.

>>> parse_spec("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q8_0@main")
HubSpec(repo='Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF', tag='Q8_0', revision='main')
>>> parse_spec("Qwen/Qwen2.5-Coder-0.5B").requested
'Qwen/Qwen2.5-Coder-0.5B'
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specls.models.conversion import ConversionError, convert, convert_in_child
from specls.models.model_store import ConvertSettings, EntryKey, ModelStore
from specls.models.progress import Progress, no_progress

from specls.api import EngineError

log = logging.getLogger(__name__)

DEFAULT_REVISION = "main"
# what a safetensors checkpoint needs for a conversion (config, weights, tokenizer; no README/images)
CHECKPOINT_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt")
INSTALL_EXPORT = "pip install 'specls[export]'"
# the export extra's modules a conversion imports (GGUF sources also need gguf and accelerate)
_EXPORT_MODULES = ("torch", "transformers", "onnx", "onnxscript", "safetensors")
_GGUF_MODULES = ("gguf", "accelerate")
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<tag>[^@:/]+))?(?:@(?P<rev>[^@]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# "preferred" GGUF quantization when a repo has several files and no tag was given: the conversion
# dequantizes anyway, so the most precise common one
_DEFAULT_GGUF_QUANTS = ("Q8_0", "F16", "BF16", "F32")


class HubError(EngineError):
    """A model spec that cannot be resolved, downloaded or converted; the message says which step."""


@dataclass(frozen=True)
class HubSpec:
    """A hub model: ``repo`` ("ORG/NAME"), the GGUF ``tag`` (a quantization or a file name) and the
    ``revision`` asked for (None: main)."""

    repo: str
    tag: str | None = None
    revision: str | None = None

    @property
    def ref(self) -> str:
        return self.revision or DEFAULT_REVISION

    @property
    def requested(self) -> str:
        """The spec without its revision: what cache entries are looked up by."""
        return f"{self.repo}:{self.tag}" if self.tag else self.repo


def parse_spec(spec: str) -> HubSpec:
    """A hub spec ``ORG/NAME[:TAG][@REVISION]``. Raises HubError for anything else."""
    m = _HUB_ID.match(spec.strip())
    if m is None:
        raise HubError(
            f"{spec}: not a model directory, a .gguf file, or a Hugging Face hub id "
            "(ORG/NAME, ORG/NAME:QUANT or ORG/NAME:FILE.gguf, optionally @REVISION)"
        )
    return HubSpec(m["repo"], m["tag"], m["rev"])


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (read at each call: tests and services set it late)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def resolve_model(
    spec: str,
    *,
    settings: ConvertSettings | None = None,
    progress: Progress = no_progress,
    store: ModelStore | None = None,
    isolated: bool = False,
) -> Path:
    """A loadable model directory for ``spec`` (see the module docstring), downloading and converting
    into the cache when needed. ``isolated``: convert in a child process (``specls.models.conversion``:
    nothing printed on this process's stdout, the memory back afterwards). Raises HubError (an
    EngineError) with one clear message."""
    settings = settings or ConvertSettings()
    store = store or ModelStore()
    text = spec.strip()
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.suffix.lower() == ".gguf" and (path.exists() or _HUB_ID.match(text) is None):
        if not path.is_file():
            raise HubError(f"{path}: no such GGUF file")
        return _resolve_local_gguf(path.resolve(), settings, progress, store, isolated)
    if path.exists() or text.startswith((".", "/", "~")):
        raise HubError(f"{text}: not a model directory or a .gguf file")
    return _resolve_hub(parse_spec(text), settings, progress, store, isolated)


def _resolve_local_gguf(
    path: Path, settings: ConvertSettings, progress: Progress, store: ModelStore, isolated: bool
) -> Path:
    st = path.stat()
    key = EntryKey(f"file:{path}", f"{st.st_size}-{st.st_mtime_ns}", settings)
    entry = store.get(key)
    if entry is not None:
        progress("ready", 1.0, entry.id)
        return entry.path
    return _convert_into(
        store, key, str(path), str(path), key.revision, settings, progress, gguf=True, isolated=isolated
    )


def _resolve_hub(
    hub: HubSpec, settings: ConvertSettings, progress: Progress, store: ModelStore, isolated: bool
) -> Path:
    if hub.revision is not None and _COMMIT.match(hub.revision):
        cached = store.find(hub.requested, hub.revision, settings)
        if cached:  # a commit never changes: no need to ask the hub
            progress("ready", 1.0, cached[0].id)
            return cached[0].path
    if hub_offline():
        return _cached_or_fail(hub, settings, store, progress, "HF_HUB_OFFLINE is set")
    progress("resolving", 0.0, hub.repo)
    try:
        commit, files = _repo_files(hub)
    except _Unreachable as exc:
        return _cached_or_fail(hub, settings, store, progress, f"the hub cannot be reached: {exc}")
    gguf_file = _pick_gguf(hub, files)
    if gguf_file is None and not any(f.endswith(".safetensors") for f in files):
        raise HubError(
            f"{hub.repo}: no safetensors weights and no GGUF file at {hub.ref} "
            f"(files: {', '.join(sorted(files)[:12]) or 'none'})"
        )
    source = f"hf:{hub.repo}/{gguf_file}" if gguf_file else f"hf:{hub.repo}"
    key = EntryKey(source, commit, settings)
    entry = store.get(key)
    if entry is not None:
        progress("ready", 1.0, entry.id)
        return entry.path
    local = _download(hub, commit, gguf_file, progress)
    return _convert_into(
        store, key, hub.requested, local, hub.ref, settings, progress, gguf_file is not None, isolated
    )


class _Unreachable(Exception):
    """The hub did not answer (connection refused, timeout, offline mode)."""


def _hub_errors() -> Any:
    from huggingface_hub import errors

    return errors


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub's HTTP client raises when the hub does not answer."""
    try:
        import httpx2 as httpx  # huggingface_hub 2.x
    except ImportError:
        import httpx  # type: ignore[no-redef]
    return (httpx.TransportError, _hub_errors().OfflineModeIsEnabled)


def _hub_kwargs() -> dict[str, Any]:
    """HF_ENDPOINT and the hub cache as the environment says now: huggingface_hub reads them once, at
    import, which may be before a caller (a test, a service's settings) set them."""
    kw: dict[str, Any] = {}
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if endpoint:
        kw["endpoint"] = endpoint.rstrip("/")
    cache = os.environ.get("HF_HUB_CACHE", "").strip()
    home = os.environ.get("HF_HOME", "").strip()
    if cache:
        kw["cache_dir"] = cache
    elif home:
        kw["cache_dir"] = str(Path(home).expanduser() / "hub")
    return kw


def _repo_files(hub: HubSpec) -> tuple[str, list[str]]:
    """(commit, file names) of ``hub`` at its revision. Raises _Unreachable or HubError."""
    from huggingface_hub import HfApi

    errors = _hub_errors()
    endpoint = _hub_kwargs().get("endpoint")
    try:
        info = HfApi(endpoint=endpoint).model_info(hub.repo, revision=hub.ref)
    except _connection_errors() as exc:
        raise _Unreachable(f"{type(exc).__name__}: {exc}") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{hub.repo}: no revision {hub.ref!r} on the hub") from None
    except errors.GatedRepoError:
        raise HubError(
            f"{hub.repo}: a gated model; accept its terms on the hub and log in (`hf auth login` or HF_TOKEN)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"{hub.repo}: no such model on the hub (or a private one: log in with `hf auth login` or HF_TOKEN)"
        ) from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        if isinstance(status, int) and status >= 500:
            raise _Unreachable(f"HTTP {status}") from None
        raise HubError(f"{hub.repo}: the hub answered HTTP {status} ({_first_line(exc)})") from None
    if not info.sha:
        raise HubError(f"{hub.repo}: the hub gave no commit for revision {hub.ref!r}")
    return info.sha, [s.rfilename for s in info.siblings or []]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _pick_gguf(hub: HubSpec, files: list[str]) -> str | None:
    """The GGUF file of the repo ``hub`` names, or None for a safetensors checkpoint."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if hub.tag is None:
        if not ggufs or any(f.endswith(".safetensors") for f in files):
            return None
        if len(ggufs) == 1:
            return ggufs[0]
        for quant in _DEFAULT_GGUF_QUANTS:
            hit = [f for f in ggufs if _has_quant(f, quant)]
            if len(hit) == 1:
                return hit[0]
        raise HubError(
            f"{hub.repo}: holds {len(ggufs)} GGUF files; name one as {hub.repo}:QUANT or "
            f"{hub.repo}:FILE.gguf ({', '.join(ggufs)})"
        )
    exact = [f for f in ggufs if f == hub.tag or Path(f).name == hub.tag]
    hits = exact or [f for f in ggufs if _has_quant(f, hub.tag)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise HubError(
            f"{hub.repo}: no GGUF file matches {hub.tag!r} at {hub.ref} "
            f"(GGUF files: {', '.join(ggufs) or 'none'})"
        )
    shards = [f for f in hits if re.search(r"-\d{5}-of-\d{5}\.gguf$", f)]
    if shards:
        raise HubError(
            f"{hub.repo}: {hub.tag} is split into {len(shards)} GGUF shards, which specls cannot read"
        )
    raise HubError(f"{hub.repo}: {len(hits)} GGUF files match {hub.tag!r} ({', '.join(hits)}); name one file")


def _has_quant(filename: str, quant: str) -> bool:
    """Whether a GGUF file name carries ``quant`` as a whole word ("...-q8_0.gguf" has Q8_0; "Q4_K"
    is not in "...-Q4_K_M.gguf")."""
    stem = Path(filename).name.lower().removesuffix(".gguf")
    return re.search(rf"(^|[-_.]){re.escape(quant.lower())}($|[-.])", stem) is not None


def _cached_or_fail(
    hub: HubSpec, settings: ConvertSettings, store: ModelStore, progress: Progress, why: str
) -> Path:
    cached = store.find(hub.requested, hub.ref, settings)
    if cached:
        log.info("%s: %s; using the cached %s", hub.requested, why, cached[0].id)
        progress("ready", 1.0, cached[0].id)
        return cached[0].path
    raise HubError(
        f"{hub.requested}@{hub.ref}: not in the model cache ({store.root}) with these settings, and {why}"
    )


def _download(hub: HubSpec, commit: str, gguf_file: str | None, progress: Progress) -> str:
    """The local path of the downloaded checkpoint dir (or GGUF file), in huggingface_hub's cache."""
    from huggingface_hub import hf_hub_download, snapshot_download

    errors = _hub_errors()
    kw = _hub_kwargs()
    bar = _progress_bar_class(progress, gguf_file or hub.repo)
    progress("downloading", 0.0, gguf_file or hub.repo)
    try:
        if gguf_file is not None:
            local = hf_hub_download(hub.repo, gguf_file, revision=commit, tqdm_class=bar, **kw)
        else:
            local = snapshot_download(
                hub.repo, revision=commit, allow_patterns=list(CHECKPOINT_PATTERNS), tqdm_class=bar, **kw
            )
    except errors.RemoteEntryNotFoundError:
        raise HubError(f"{hub.repo}: {gguf_file or 'a file'} is listed but missing on the hub") from None
    except (*_connection_errors(), errors.HfHubHTTPError, OSError, errors.LocalEntryNotFoundError) as exc:
        raise HubError(
            f"{hub.requested}: download failed ({type(exc).__name__}: {_first_line(exc)}); "
            "run again to continue it"
        ) from None
    progress("downloading", 1.0, gguf_file or hub.repo)
    return str(local)


def _progress_bar_class(progress: Progress, label: str) -> type:
    """A tqdm class for huggingface_hub's ``tqdm_class`` that draws nothing and reports the bytes of
    the download to ``progress`` (never going backwards: totals grow as files start)."""
    from tqdm import tqdm

    class _Sink:
        def write(self, s: str) -> int:
            return len(s)

        def flush(self) -> None:
            pass

    best = [0.0]

    class _ReportingBar(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["file"] = _Sink()
            kwargs["disable"] = False
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            out = super().update(n)
            if self.unit == "B" and self.total:
                frac = min(1.0, self.n / self.total)
                if frac > best[0]:
                    best[0] = frac
                    progress("downloading", frac, label)
            return out

    return _ReportingBar


def missing_export_modules(gguf: bool) -> list[str]:
    """The modules of the export extra that are not installed (none: a conversion can run)."""
    names = _EXPORT_MODULES + (_GGUF_MODULES if gguf else ())
    return [n for n in names if importlib.util.find_spec(n) is None]


def _convert_into(
    store: ModelStore,
    key: EntryKey,
    requested: str,
    source: str,
    ref: str,
    settings: ConvertSettings,
    progress: Progress,
    gguf: bool,
    isolated: bool,
) -> Path:
    missing = missing_export_modules(gguf)
    if missing:
        raise HubError(
            f"{requested}: converting it to ONNX needs the export tools ({', '.join(missing)} not installed): "
            f"{INSTALL_EXPORT}"
        )
    progress("converting", 0.0, requested)
    with store.build(key, requested, ref) as out:
        try:
            if isolated:
                convert_in_child(source, out, settings, progress, store.log_path(key))
            else:
                convert(source, out, settings, progress)
        except ConversionError as exc:
            raise HubError(f"{requested}: conversion failed, nothing was cached: {exc}") from None
    entry = store.get(key)
    if entry is None:  # renamed into place by build(): only a concurrent rm gets here
        raise HubError(f"{requested}: the converted model vanished from {store.root}")
    progress("ready", 1.0, entry.id)
    return entry.path


__all__ = [
    "CHECKPOINT_PATTERNS",
    "INSTALL_EXPORT",
    "HubError",
    "HubSpec",
    "hub_offline",
    "missing_export_modules",
    "parse_spec",
    "resolve_model",
]
