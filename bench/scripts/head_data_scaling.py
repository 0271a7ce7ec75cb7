"""Is the feature head short of data or of capacity? Trains ``specls head train``'s first head (the
shipped trainer, ``models.feature_head_train.train_heads``) on growing shares of one features file
(``specls head train --features FILE``) and prints its held-out top-1 for each: the same held-out
chunks every time, the training chunks the first share of the rest.

    .venv/bin/python bench/scripts/head_data_scaling.py MODEL_DIR FEATURES.npz [--shares 0.125,0.25,0.5,1]

A steady gain per doubling says more positions would help; a flat curve that more capacity or
another architecture would. A diagnostic (run it alone on the machine), not a test.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specls.models.feature_head_train import FeatureSet, HeadTraining, projection_rows, train_heads


def share_of(f: FeatureSet, share: float, holdout: float) -> FeatureSet:
    """``f`` with the held-out chunks (the last ``holdout`` of them, as ``train_heads`` picks them) and
    the first ``share`` of the others; chunk ids kept, so ``train_heads`` holds out the same ones.

    >>> import numpy as np
    >>> f = FeatureSet(np.zeros((10, 1)), np.arange(10), np.arange(10), np.arange(10))
    >>> share_of(f, 0.5, 0.1).chunk.tolist()   # Not [0, 1, 2, 3, 4]: chunk 9 stays held out
    [0, 1, 2, 3, 4, 9]
    """
    cut = int(f.chunk.max() * (1 - holdout))  # chunks 0..cut train, the rest are held out
    keep = (f.chunk < (cut + 1) * share) | (f.chunk > cut)
    return FeatureSet(f.hidden[keep], f.tokens[keep], f.argmax[keep], f.chunk[keep])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the target's specls model directory (its projection rows)")
    p.add_argument("features", help="a features file of that target (specls head train --features)")
    p.add_argument("--shares", default="0.125,0.25,0.5,1", help="shares of the training chunks")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    f = FeatureSet.load(Path(args.features))
    cfg = HeadTraining(heads=1)
    print(f"{args.features}: {f.tokens.size} positions in {int(f.chunk.max()) + 1} chunks; {cfg}")
    for share in (float(x) for x in args.shares.split(",")):
        sub = share_of(f, share, cfg.holdout)
        t0 = time.perf_counter()
        out = train_heads(sub, lambda ids: projection_rows(Path(args.model), ids), cfg)
        print(
            f"share {share:g}: {out.samples[0]} training samples, held-out top-1 {out.accuracy[0]:.3f}"
            f" (untrained {out.base_accuracy[0]:.3f}), {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
