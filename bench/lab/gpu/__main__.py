"""``python -m specls.bench.gpu``: the benchmark without the rest of the CLI (the device image has no pygls)."""

from __future__ import annotations

import sys

from specls.bench.gpu.cli import main

if __name__ == "__main__":
    sys.exit(main())
