"""A recent edit as the prompt shows it: unified diffs with the file's line numbers, and the edits
between two versions of a file."""

from __future__ import annotations

from specls.next_edit.edit_diff import EditDiff, diffs_between


def test_unified_diff_headers_carry_the_files_line_numbers() -> None:
    # Not "@@ -0,0 +1 @@": an insertion before line 10 (0-based 9) is after line 9
    assert EditDiff("a.py", "", "x\n", 9).unified(context=0) == "--- a/a.py\n+++ b/a.py\n@@ -9,0 +10 @@\n+x\n"
    assert EditDiff("a.py", "x\n", "", 9).unified(context=0) == "--- a/a.py\n+++ b/a.py\n@@ -10 +9,0 @@\n-x\n"
    assert EditDiff("a.py", "same\n", "same\n", 3).unified() == ""  # nothing changed, nothing shown
    # a last line without its newline still ends its diff line
    assert EditDiff("a.py", "x", "y", 0).unified().endswith("-x\n+y\n")


def test_diffs_between_two_versions() -> None:
    before = "import os\n\ndef f(a):\n    return a\n"
    after = "import os\nimport re\n\ndef f(b):\n    return b\n"
    diffs = diffs_between("m.py", before, after)
    assert [(d.start_line, d.old, d.new) for d in diffs] == [
        (1, "", "import re\n"),
        (3, "def f(a):\n    return a\n", "def f(b):\n    return b\n"),
    ]
    assert diffs_between("m.py", before, before) == []
