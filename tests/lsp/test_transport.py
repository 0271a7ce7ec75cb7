from __future__ import annotations

import doctest
import json
import logging
import sys

import pytest
from specls.lsp.transport import Framer, Refused, check_message, encode, scrub_error, scrub_frame


def frame(obj: dict) -> bytes:
    return encode(obj)


A = {"jsonrpc": "2.0", "id": 1, "method": "a", "params": {"text": "Content-Length: 5"}}
B = {"jsonrpc": "2.0", "id": 2, "method": "b", "params": {"s": "\u00e9\U0001f600"}}


def bodies(stream: bytes, chunk: int) -> list[bytes]:
    framer = Framer()
    out: list[bytes] = []
    for i in range(0, len(stream), chunk):
        framer.feed(stream[i : i + chunk])
        out.extend(framer.messages())
    return out


@pytest.mark.parametrize("chunk", [1, 7, 4096])
@pytest.mark.parametrize(
    ("stream", "want"),
    [
        (frame(A) + frame(B), [A, B]),
        # extra headers, lower-case name
        (b"content-length: 2\r\nContent-Type: x\r\n\r\n{}" + frame(B), [{}, B]),
        # garbage before a header is skipped (not: everything after it lost)
        (b"junk\r\n\r\n" + frame(A), [A]),
        # a non-numeric Content-Length is dropped, the next message is read
        (b"Content-Length: x1\r\n\r\n{}" + frame(B), [B]),
        # a declared length longer than the body: resynchronised at the next header (not: B swallowed)
        (b"Content-Length: 999\r\n\r\n" + json.dumps(A).encode() + frame(B), [A, B]),
    ],
)
def test_framer(stream, want, chunk):
    got = []
    for body in bodies(stream, chunk):
        try:
            got.append(json.loads(body))
        except ValueError:
            got.append("bad")
    assert got == want


def test_too_short_length_gives_one_bad_body_then_recovers():
    body = json.dumps(A).encode()
    stream = b"Content-Length: 10\r\n\r\n" + body + frame(B)
    got = bodies(stream, 3)
    assert json.loads(got[-1]) == B
    assert len(got) == 2  # the truncated one (unparseable) and B


def test_byte_length_not_character_length():
    data = frame(B)
    header, _, body = data.partition(b"\r\n\r\n")
    assert int(header.split(b":")[1]) == len(body)


# ---------------------------------------------------------------------- issue 13: framing


HEAD_B = frame(B)[: frame(B).index(b"\r\n\r\n") + 4]  # b"Content-Length: NN\r\n\r\n"
RAW_A = json.dumps(A).encode()


def decoded(stream: bytes, chunk: int, framer: Framer | None = None) -> list[object]:
    framer = framer or Framer()
    got: list[object] = []
    for i in range(0, len(stream), chunk):
        framer.feed(stream[i : i + chunk])
        for body in framer.messages():
            try:
                got.append(json.loads(body))
            except ValueError:
                got.append("bad")
    return got


@pytest.mark.parametrize("chunk", [1, 7, 4096, 65536])
def test_content_length_with_4301_digits_is_garbage_not_a_crash(chunk):
    # before: int() raised ValueError (Python's 4,300-digit limit) and the stdio server exited 1
    stream = b"Content-Length: " + b"1" * 4301 + b"\r\n\r\n{}" + frame(B)
    assert decoded(stream, chunk) == [B]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
@pytest.mark.parametrize("extra", range(1, len(HEAD_B) + 4))
def test_declared_length_too_long_by_less_than_a_header(extra, chunk):
    # wrong answer before: A's body took the start of B's header, B was swallowed
    stream = b"Content-Length: %d\r\n\r\n" % (len(RAW_A) + extra) + RAW_A + frame(B)
    assert decoded(stream, chunk) == [A, B]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
@pytest.mark.parametrize(
    ("stream", "want"),
    [
        # two Content-Length headers: the last counts (not: the first, too long, swallowing B)
        (b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(RAW_A) + 5, len(RAW_A)) + RAW_A, [A]),
        # ... the last too long: cut at B's header (not: B swallowed)
        (b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(RAW_A), len(RAW_A) + 7) + RAW_A, [A]),
        (b"Content-Length: 3\r\nContent-Length: 999\r\n\r\n" + RAW_A, [A]),
        # two Content-Length headers, the last too short: one bad body, the rest skipped
        (b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(RAW_A) + RAW_A, ["bad"]),
        # a header block without the blank line, the body right behind it: skipped (not: B's body read)
        (b"Content-Length: %d\r\n" % len(RAW_A) + RAW_A, []),
        # ... B's header right behind it: B's Content-Length counts (not: a block spanning both)
        (b"Content-Length: 10\r\n", []),
        (b"Content-Length: 10\r\nContent-Type: x\r\n", []),
        # a field line holding the next header glued to garbage (not: B's header taken as a field)
        (b"Content-Length: 10\r\nX-y: z", []),
        # a header line that never ends (no newline for 256 bytes), a block that never ends
        (b"Content-Length: 10" + b" " * 300, []),
        (b"Content-Length: 10\r\n" + b"X: y\r\n" * 2000, []),
        # lengths that are no numbers, or absurd ones
        (b"Content-Length: 1e3\r\n\r\n{}", []),
        (b"Content-Length: \xd9\xa3\r\n\r\n{}", []),  # an Arabic-Indic digit
        (b"Content-Length:\r\n\r\n{}", []),
        (b"Content-Length: 99999999999999999999\r\n\r\n" + RAW_A, []),  # refused, discarded, B found
        # a header cut in pieces by garbage
        (b"Content-Len\r\ngth: 5\r\n\r\n{}", []),
        # an empty body is one (bad) message
        (b"Content-Length: 0\r\n\r\n", ["bad"]),
    ],
)
def test_a_bad_frame_never_swallows_the_next_message(stream, want, chunk):
    assert decoded(stream + frame(B), chunk) == [*want, B]


def test_body_bytes_are_scanned_once_not_per_read():
    # before: every read re-sliced and re-scanned the whole pending body (quadratic: 8 MB took 6.4 s)
    n = 8 * 1024 * 1024
    text = ("x = 1  # Content-Length: 5 in a string is no header\n" * (n // 52))[:n]
    stream = encode({"jsonrpc": "2.0", "method": "m", "params": {"text": text}}) + frame(B)
    chunk = 64 * 1024
    framer = Framer()
    feeds = 0
    out: list[bytes] = []
    for i in range(0, len(stream), chunk):
        framer.feed(stream[i : i + chunk])
        feeds += 1
        out.extend(framer.messages())
    assert [json.loads(b) for b in out][1] == B
    assert json.loads(out[0])["params"]["text"] == text
    assert framer.received == len(stream)
    # one pass over the stream plus a header's worth of overlap per read
    assert framer.scanned <= len(stream) + 64 * feeds + 1024


@pytest.mark.parametrize("chunk", [1024, 65536])
def test_framing_work_grows_linearly_with_the_message(chunk):
    def work(n: int) -> int:
        stream = b"Content-Length: %d\r\n\r\n" % n + b"7" * n
        framer = Framer()
        for i in range(0, len(stream), chunk):
            framer.feed(stream[i : i + chunk])
            assert list(framer.messages()) in ([], [b"7" * n])
        return framer.scanned

    small, big = work(1 << 20), work(4 << 20)
    assert big <= 4 * small + 4096  # quadratic would be 16x


def test_hostile_garbage_is_scanned_a_bounded_number_of_times():
    # many header starts with no line end: each is given up after 256 bytes, the work stays linear
    stream = (b"Content-Length" + b"1" * 90) * 20_000
    framer = Framer()
    for i in range(0, len(stream), 4096):
        framer.feed(stream[i : i + 4096])
        assert list(framer.messages()) == []
    assert framer.scanned <= 20 * len(stream)
    assert framer.buffered < 4096


def test_an_oversized_message_is_refused_while_it_streams_and_the_next_is_read():
    refused: list[Refused] = []
    framer = Framer(max_body=10_000, on_refused=refused.append)
    body = b'{"jsonrpc": "2.0", "id": 41, "method": "textDocument/completion", "params": {"t": "'
    body += b"y" * 1_000_000 + b'"}}'
    stream = b"Content-Length: %d\r\n\r\n" % len(body) + body + frame(B)
    got: list[bytes] = []
    most = 0
    for i in range(0, len(stream), 4096):
        framer.feed(stream[i : i + 4096])
        got.extend(framer.messages())
        most = max(most, framer.buffered)
    assert [json.loads(b) for b in got] == [B]
    assert most < 2 * 4096  # never buffered whole (not: the megabyte held until its end)
    assert refused == [Refused(declared=len(body), limit=10_000, msg_id=41)]
    assert framer.refused == 1
    assert framer.scanned <= len(stream) + 64 * (len(stream) // 4096 + 1) + 1024


def test_a_refused_message_without_an_id_is_reported_with_none():
    refused: list[Refused] = []
    framer = Framer(max_body=100, on_refused=refused.append)
    framer.feed(
        b"Content-Length: 1000\r\n\r\n" + b'{"jsonrpc":"2.0","method":"x","params":{"id": 3' + b" " * 960
    )
    assert list(framer.messages()) == []
    framer.feed(b"}}" + frame(B))
    assert [json.loads(b) for b in framer.messages()] == [B]
    assert refused == [Refused(1000, 100, None)]  # an id inside params is not the message's


def test_a_large_message_leaves_no_large_buffer_behind():
    framer = Framer()
    framer.feed(encode({"jsonrpc": "2.0", "method": "m", "params": {"t": "z" * 5_000_000}}) + b"Content-Le")
    assert len(list(framer.messages())) == 1
    assert framer.buffered == len(b"Content-Le")
    assert sys.getsizeof(framer._buf) < 64 * 1024  # the 5 MB allocation was given back


def test_transport_doctests():
    from specls.lsp import transport

    result = doctest.testmod(transport)
    assert result.attempted >= 8 and result.failed == 0


# ---------------------------------------------------------------------- issue 13: messages


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "shutdown"}, None),
        ({"jsonrpc": "2.0", "method": "initialized", "params": {}}, None),
        ({"jsonrpc": "2.0", "id": "a", "result": None}, None),
        ({"jsonrpc": "2.0", "id": 2, "error": {"code": 1, "message": "m"}}, None),
        ({"jsonrpc": "2.0", "id": None, "method": "x"}, None),
        # wrong answer before: -32603 with a traceback (method not a string)
        ({"jsonrpc": "2.0", "id": 3, "method": 5}, (3, -32600)),
        ({"jsonrpc": "2.0", "method": 5}, (None, -32600)),
        ({"method": 5}, (None, -32600)),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "shutdown"}, (None, -32600)),  # not: an unhashable id
        ({"jsonrpc": "2.0", "id": True, "method": "shutdown"}, (None, -32600)),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "shutdown"}, (None, -32600)),
        ({"jsonrpc": "2.0", "id": 4, "method": "specls/stats", "params": 5}, (4, -32600)),
        ({"jsonrpc": "1.0", "id": 5, "method": "shutdown"}, (5, -32600)),
        # neither a request nor a response: answered with id null (not: its id, a client request's)
        ({"jsonrpc": "2.0", "id": 7}, (None, -32600)),
        ({"jsonrpc": "2.0", "id": 7, "result": 1, "error": {}}, (None, -32600)),
        ([1, 2], (None, -32600)),
        ("x", (None, -32600)),
    ],
)
def test_check_message(raw, want):
    problem = check_message(raw)
    assert (problem if problem is None else (problem.msg_id, problem.code)) == want


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (
            {
                "code": -32603,
                "message": "TypeError: x",
                "data": {"traceback": ['  File "/srv/a/b.py", line 3']},
            },
            {"code": -32603, "message": "Internal error (details are in the server log)"},
        ),
        (  # a path in a message that is no internal error (not: sent as is)
            {"code": -32602, "message": "bad: [Errno 2] No such file: '/home/u/x/y.onnx'"},
            {"code": -32602, "message": "bad: [Errno 2] No such file: '<path>'"},
        ),
        (  # method names and URIs are no server paths
            {"code": -32601, "message": "Method Not Found: textDocument/foo $/bar file:///a/b.py"},
            {"code": -32601, "message": "Method Not Found: textDocument/foo $/bar file:///a/b.py"},
        ),
        (
            {"code": -32001, "message": "no", "data": {"retry": False}},
            {"code": -32001, "message": "no", "data": {"retry": False}},
        ),
        ({"code": -32001, "message": "no", "data": "at /usr/lib/x.py"}, {"code": -32001, "message": "no"}),
    ],
)
def test_scrub_error(error, want):
    assert scrub_error(error) == want


def test_scrub_frame_rewrites_error_responses_only():
    err = {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32603, "message": "boom", "data": {"traceback": ["/x/y"]}},
    }
    out = scrub_frame(encode(err))
    header, _, body = out.partition(b"\r\n\r\n")
    assert int(header.split(b":")[1]) == len(body)
    assert json.loads(body)["error"] == {
        "code": -32603,
        "message": "Internal error (details are in the server log)",
    }
    # a result that mentions "error" (stats) and a notification are passed as they are
    for msg in (
        {"jsonrpc": "2.0", "id": 2, "result": {"error": "/a/b/c"}},
        {"jsonrpc": "2.0", "method": "window/logMessage", "params": {"type": 1, "message": "error"}},
    ):
        assert scrub_frame(encode(msg)) == encode(msg)


def test_a_stream_of_bad_frames_does_not_flood_the_log(caplog):
    # before: one WARNING per bad frame (a buggy client wrote millions of log lines)
    framer = Framer()
    with caplog.at_level(logging.DEBUG, logger="specls.lsp.transport"):
        for _ in range(500):
            framer.feed(b"Content-Length: x\r\n\r\n{}junk")
            assert list(framer.messages()) == []
        framer.feed(frame(B))
        assert [json.loads(b) for b in framer.messages()] == [B]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 0 < len(loud) <= 21
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) >= 500  # still there at DEBUG
