"""Upgrade an exported model directory to in-place KV (``specls.models.kv_buffer``): rewrite its graph
so the past length comes from ``attention_mask`` and mark ``shared_kv_buffer`` in ``specls.json``.
``specls export`` does this itself; this is for directories exported before it did.

    .venv/bin/python scripts/share_kv_buffer.py ~/.cache/specls-real/onnx/qwen-1.5b-int4-b64 [...]

A graph that cannot share its buffers (not a fused GroupQueryAttention graph) is left as it is.
Weights stored as external data are not touched; a graph with embedded weights is rewritten whole
(~5 s and ~3 GB of memory for the 1.1 GB int4 1.5B).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from specls.models.kv_buffer import share_kv_buffer
from specls.models.spec import load_spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dirs", nargs="+", type=Path)
    args = ap.parse_args()
    failed = 0
    for d in args.model_dirs:
        spec = load_spec(d)
        if spec.shared_kv_buffer:
            print(f"{d}: already shares its KV buffer")
        elif share_kv_buffer(d / spec.onnx_file, spec):
            replace(spec, shared_kv_buffer=True).write(d)
            print(f"{d}: graph rewritten, specls.json marked shared_kv_buffer")
        else:
            print(f"{d}: not a fused GroupQueryAttention graph; left as it is", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
