"""``python -m bench.lab.gpu`` from the repository root."""

from __future__ import annotations

import sys

from bench.lab.gpu.cli import main

if __name__ == "__main__":
    sys.exit(main())
