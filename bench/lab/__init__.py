"""Lab benchmarks: research measurements behind bench/README.md, not shipped in the wheel.

Run from the repository root: ``python -m bench.lab.gpu``, ``python -m bench.lab.quant``,
``python -m bench.lab.fim``."""
