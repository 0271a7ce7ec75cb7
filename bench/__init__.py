"""bench/: results, lab benchmarks and measurement scripts; not part of the wheel."""
