"""bench/lab/fim.py (`python -m bench.lab.fim`): the layout grid, the line task and its scoring (doctests and tables), and one
small run on the bundled model whose numbers must add up."""

from __future__ import annotations

import doctest
import io

import pytest

from bench.lab import fim
from bench.lab.fim import FimBenchOptions, exact, layouts, line_task, run_bench, tokens_after_cursor
from specls.bench.decode import Point


def test_doctests() -> None:
    result = doctest.testmod(fim)
    assert result.attempted >= 4 and result.failed == 0


@pytest.mark.parametrize(
    ("completion", "expected", "match"),
    [
        ("a, b)", "a, b)", True),
        ("a, b)\n    return x", "a, b)", True),  # only the first line counts
        ("a, b)   ", "a, b)", True),
        ("a, b", "a, b)", False),  # Not a match: one character short
        ("", "", True),
        ("\nx", "x", False),  # Not a match: the line the cursor was on is empty here
    ],
)
def test_exact(completion: str, expected: str, match: bool) -> None:
    assert exact(completion, expected) is match


def test_line_task_removes_only_the_rest_of_the_line() -> None:
    p = Point("f.py", "line", "def f():\n    ", "\n", "return 1\n    pass")
    prefix, suffix, expected = line_task(p)
    assert (prefix, expected) == ("def f():\n    ", "return 1")
    assert suffix == "\n    pass\n"  # Not "\n": the other removed lines go back into the suffix
    assert prefix + expected + suffix == p.prefix + p.middle + p.suffix


def test_layouts_cover_both_orders_and_prefix_only() -> None:
    names = [x.name for x in layouts("spm", (32, 8))]
    assert names == ["spm-32", "spm-8", "psm-32", "prefix"]
    assert tokens_after_cursor([5, 2, 9, 3], "prefix", 2) == 0


def test_run_on_the_bundled_model_adds_up() -> None:
    out = io.StringIO()
    opt = FimBenchOptions(n=2, threads=1, prefix_tokens=64, suffix_windows=(24, 8))
    assert run_bench(opt, out) == 0
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| ") and "/2 " in line]
    assert [r.split("|")[1].strip() for r in rows] == [x.name for x in layouts("spm", (24, 8))]
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        hits = int(cells[1].split("/")[0])
        assert 0 <= hits <= 2
        after = float(cells[2])
        # the bundled template is SPM: the prefix ends every prompt except the PSM one's
        assert (after > 0) == cells[0].startswith("psm"), row


@pytest.mark.parametrize(
    ("text", "want"), [("64,32,16", (64, 32, 16)), ("64, 32,", (64, 32)), ("8", (8,)), ("", ())]
)
def test_int_list(text: str, want: tuple[int, ...]) -> None:
    from specls.bench import int_list

    assert int_list(text) == want  # Not ("64", " 32"): ints, spaces and a trailing comma dropped


def test_int_list_refuses_a_non_integer() -> None:
    from specls.bench import int_list

    with pytest.raises(ValueError):
        int_list("64,x")
