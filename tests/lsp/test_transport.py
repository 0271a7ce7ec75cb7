from __future__ import annotations

import json

import pytest
from specls.lsp.transport import Framer, encode


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
