"""``specls datastore``: build a code datastore for prompt lookup (``specls.datastore_cache``) from the
standard library, the installed packages or a folder, for one model's tokenizer; list those built.

    specls datastore build --from stdlib --model DIR     # then: specls serve --datastore stdlib
    specls datastore list
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from specls.datastore_cache import (
    DEFAULT_MAX_TOKENS,
    build_datastore,
    corpus_files,
    corpus_name,
    datastore_dir,
    datastores_root,
    tokenizer_key,
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "datastore",
        help="build a code datastore for prompt lookup (stdlib, site-packages or a folder); list them",
        description="A datastore is the token ids of a code corpus with a suffix array: prompt lookup "
        "drafts from it where the open buffers have nothing to copy. Kept in the model cache, per tokenizer.",
    )
    dsub = p.add_subparsers(dest="datastore_command", metavar="ACTION")
    build = dsub.add_parser("build", help="tokenise a corpus with a model's tokenizer and index it")
    build.add_argument(
        "--from", dest="corpus", default="stdlib", metavar="CORPUS", help="stdlib, site-packages or a folder"
    )
    build.add_argument(
        "--model", default=None, metavar="DIR", help="the model whose tokenizer (default: bundled)"
    )
    build.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="cut the corpus here")
    build.add_argument("--depth", type=int, default=16, help="longest context tail matched")
    build.add_argument("--out", default=None, metavar="DIR", help="write here instead of the cache")
    dsub.add_parser("list", help="the datastores built (the default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.datastore_command or "list") == "list":
        return _list()
    return _build(args)


def _list() -> int:
    root = datastores_root()
    metas = sorted(root.glob("*/*/datastore.json")) if root.is_dir() else []
    if not metas:
        sys.stdout.write(f"no datastores in {root} (specls datastore build --from stdlib --model DIR)\n")
    for meta_file in metas:
        meta = json.loads(meta_file.read_text())
        sys.stdout.write(
            f"{meta_file.parent.parent.name}/{meta_file.parent.name}: {meta.get('tokens')} tokens, "
            f"{meta.get('mib')} MiB, {meta.get('documents')} files, from {meta.get('corpus')}\n"
        )
    return 0


def _build(args: argparse.Namespace) -> int:
    from specls.models.loader import resolve_model_dir
    from specls.models.tokenizer import Tokenizer

    say = sys.stderr.write
    tok = Tokenizer.from_file(resolve_model_dir(args.model, "target") / "tokenizer.json")
    try:
        files = corpus_files(args.corpus)
    except ValueError as exc:
        say(f"specls datastore: {exc}\n")
        return 2
    key = tokenizer_key(tok)
    out = Path(args.out) if args.out else datastore_dir(args.corpus, key)
    say(f"datastore: {len(files)} files from {args.corpus}, tokenizer {key}\n")
    t0 = time.perf_counter()

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.hf.encode_batch(texts, add_special_tokens=False)]

    store, tokenize_s = build_datastore(
        files, encode_batch, corpus_name(args.corpus), args.max_tokens, args.depth
    )
    total_s = time.perf_counter() - t0
    meta = {"corpus": args.corpus, "tokenizer": key, "tokenize_s": round(tokenize_s, 2)}
    store.save(out, meta)
    st = store.stats()
    sys.stdout.write(
        f"{out}: {st.documents} files, {st.tokens} tokens, {st.nbytes / 2**20:.1f} MiB; "
        f"{total_s:.1f} s (tokenising {tokenize_s:.1f} s, the suffix array {st.build_s:.1f} s)\n"
    )
    return 0
