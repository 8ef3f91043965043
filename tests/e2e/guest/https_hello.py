"""An HTTPS server with a self-signed certificate, standard library only (runs in a sandbox):
`https_hello.py PORT CERT KEY` answers every GET with the scheme it was reached over."""

import http.server
import ssl
import sys


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello over tls\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Hello)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
