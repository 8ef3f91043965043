"""Connect envelope codec."""

from __future__ import annotations

import struct

import pytest

from agentenv.guest.rpc import (
    FLAG_END_STREAM,
    ConnectError,
    EnvelopeDecoder,
    encode_envelope,
    iter_messages,
)


def test_envelope_layout() -> None:
    frame = encode_envelope({"a": 1})
    assert frame[0] == 0
    assert struct.unpack(">I", frame[1:5])[0] == len(frame) - 5
    assert frame[5:] == b'{"a":1}'


def test_round_trip_byte_by_byte() -> None:
    messages = [{"event": {"start": {"pid": 7}}}, {"x": "é" * 1000}, {}]
    wire = b"".join(encode_envelope(m) for m in messages) + encode_envelope({}, FLAG_END_STREAM)
    decoder = EnvelopeDecoder()
    got = []
    for i in range(len(wire)):
        got.extend(decoder.feed(wire[i : i + 1]))
    assert [e.message for e in got] == [*messages, {}]
    assert [e.end_stream for e in got] == [False, False, False, True]
    assert decoder.pending == 0


def test_iter_messages_stops_at_end_stream() -> None:
    wire = encode_envelope({"n": 1}) + encode_envelope({}, FLAG_END_STREAM) + b"junk"
    assert list(iter_messages([wire])) == [{"n": 1}]


def test_iter_messages_raises_trailer_error() -> None:
    trailer = {"error": {"code": "deadline_exceeded", "message": "too slow"}}
    wire = encode_envelope({"n": 1}) + encode_envelope(trailer, FLAG_END_STREAM)
    it = iter_messages([wire[:3], wire[3:]])
    assert next(it) == {"n": 1}
    with pytest.raises(ConnectError) as info:
        next(it)
    assert info.value.code == "deadline_exceeded"
    assert info.value.message == "too slow"


def test_truncated_stream_is_an_error() -> None:
    wire = encode_envelope({"n": 1})
    with pytest.raises(ConnectError, match="inside an envelope"):
        list(iter_messages([wire[:-2]]))


def test_compressed_flag_rejected() -> None:
    with pytest.raises(ConnectError, match="compressed"):
        EnvelopeDecoder().feed(encode_envelope({}, 0x01))
