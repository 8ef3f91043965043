"""Connect protocol envelopes: a flag byte, a big-endian u32 length, then a JSON message."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
_HEADER = struct.Struct(">BI")
MAX_MESSAGE = 64 * 1024 * 1024


class ConnectError(Exception):
    """An RPC failed: a Connect error code string (or HTTP status) and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Envelope:
    """One decoded frame: its flags and its JSON message."""

    flags: int
    message: dict[str, Any] = field(default_factory=dict)

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM)


def encode_envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """Frame one JSON message."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(body)) + body


class EnvelopeDecoder:
    """Incremental decoder: feed arbitrary chunks, get whole envelopes back."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[Envelope]:
        self._buf += chunk
        out: list[Envelope] = []
        while len(self._buf) >= _HEADER.size:
            flags, length = _HEADER.unpack_from(self._buf)
            if length > MAX_MESSAGE:
                raise ConnectError("internal", f"envelope too large ({length} bytes)")
            end = _HEADER.size + length
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            if flags & FLAG_COMPRESSED:
                raise ConnectError("internal", "compressed envelope received but not negotiated")
            out.append(Envelope(flags, _parse(body)))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete envelope still buffered."""
        return len(self._buf)


def _parse(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        message = json.loads(body)
    except ValueError as exc:
        raise ConnectError("internal", f"invalid JSON in envelope: {exc}") from exc
    if not isinstance(message, dict):
        raise ConnectError("internal", "envelope message is not a JSON object")
    return message


def iter_messages(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Yield the data messages of a response stream; raise ConnectError on an error trailer."""
    decoder = EnvelopeDecoder()
    for chunk in chunks:
        for env in decoder.feed(chunk):
            if env.end_stream:
                error = env.message.get("error")
                if error:
                    raise error_from_json(error)
                return
            yield env.message
    if decoder.pending:
        raise ConnectError("internal", "stream ended inside an envelope")


def error_from_json(data: Any, status: int | None = None) -> ConnectError:
    """Build a ConnectError from a Connect error object (or any JSON error body)."""
    if isinstance(data, dict):
        code = data.get("code")
        message = str(data.get("message") or data.get("detail") or "")
        if code is not None and code != "":
            return ConnectError(str(code), message)
        if status is not None:
            return ConnectError(str(status), message)
        return ConnectError("unknown", message)
    return ConnectError(str(status) if status else "unknown", str(data))
