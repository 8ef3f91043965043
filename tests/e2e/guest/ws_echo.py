"""A WebSocket echo server using only the standard library (runs inside a sandbox)."""

import base64
import hashlib
import socketserver
import struct
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        headers = {}
        self.rfile.readline()
        while (line := self.rfile.readline().strip()) != b"":
            key, _, value = line.partition(b":")
            headers[key.strip().lower()] = value.strip()
        if b"sec-websocket-key" not in headers:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            return
        accept = base64.b64encode(hashlib.sha1(headers[b"sec-websocket-key"] + GUID).digest())
        self.wfile.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                return
            reply = b"echo:" + data
            size = len(reply)
            if size < 126:
                header = bytes([0x80 | opcode, size])
            else:
                header = bytes([0x80 | opcode, 126]) + struct.pack(">H", size)
            self.wfile.write(header + reply)


socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", int(sys.argv[1])), Echo).serve_forever()
