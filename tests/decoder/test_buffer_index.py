"""BufferIndex: pending buffer texts reach the n-gram index at a flush; a big re-index waits for its
interval (a fake clock, no sleeping)."""

from __future__ import annotations

import pytest
from specls.decoder.buffer_index import BufferIndex, ReindexPolicy, common_prefix_chars


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("def f(x):", "def g(x):", 4),
        ("abc", "abc", 3),
        ("abc", "abcd", 3),  # Not 4: the shorter one ends
        ("", "abc", 0),
        ("xbc", "abc", 0),  # Not 2: a prefix, not a common substring
    ],
)
def test_common_prefix_chars(a: str, b: str, want: int) -> None:
    assert common_prefix_chars(a, b) == want


def test_big_reindex_waits_for_its_interval_small_ones_do_not() -> None:
    clock = Clock()
    buffers = BufferIndex(ReindexPolicy(max_chars=5, interval_s=10.0), clock=clock)
    buffers.update("a", "x = 1\n")
    assert buffers.index.tokens("a") == []  # Not indexed before a flush
    buffers.flush(encode)
    assert buffers.index.tokens("a") == encode("x = 1\n")  # a new buffer: at once
    buffers.update("a", "# a long header\nx = 1\n")  # the whole tail changes
    clock.now += 9.0
    buffers.flush(encode)
    assert buffers.index.tokens("a") == encode("x = 1\n")  # Not yet: re-indexed 9 s ago
    buffers.update("b", "y")
    clock.now += 1.0
    buffers.flush(encode)
    assert buffers.index.tokens("a") == encode("# a long header\nx = 1\n")  # the interval passed
    assert buffers.index.tokens("b") == encode("y")
    buffers.update("a", "# a long header\nx = 12\n")  # a small change at the end
    buffers.flush(encode)
    assert buffers.index.tokens("a") == encode("# a long header\nx = 12\n")  # at once
    buffers.update("a", "!" + "# a long header\nx = 12\n")
    buffers.flush(encode, force=True)
    assert buffers.index.tokens("a")[0] == ord("!")  # forced: at once


def test_close_removes_and_a_pending_text_never_revives_it() -> None:
    buffers = BufferIndex()
    buffers.update("a", "x = 1\n")
    buffers.flush(encode)
    buffers.update("a", "x = 2\n")
    buffers.close("a")  # closed after the update: the update must not bring it back
    buffers.flush(encode)
    assert "a" not in buffers.index and len(buffers) == 0
