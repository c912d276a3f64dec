"""A tiny HTTP email API on loopback, for the demo, the tests and load tests.

It plays the part of a real provider that honours ``Idempotency-Key``: every
POST is recorded (``deliveries``), but an email is "sent" only once per key
(``sent``).  Run it in-process with :class:`MailSink` or as
``python -m pgfence.tools.mailsink PORT``.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class MailSink:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.deliveries: Counter[str] = Counter()   # key -> requests seen
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                key = self.headers.get("Idempotency-Key") or ""
                with sink.lock:
                    sink.deliveries[key] += 1
                    first = sink.deliveries[key] == 1
                body = json.dumps({"key": key, "duplicate": not first}).encode()
                self.send_response(200 if first else 208)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                with sink.lock:
                    body = json.dumps(dict(sink.deliveries)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        # The address of an IPv4 or IPv6 socket: host is a str, never bytes.
        return f"http://{host!s}:{port}/send"

    @property
    def requests(self) -> int:
        with self.lock:
            return sum(self.deliveries.values())

    @property
    def sent(self) -> int:
        """Emails actually sent: one per distinct key."""
        with self.lock:
            return len(self.deliveries)

    def start(self) -> Self:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    sink = MailSink(port=int(sys.argv[1]) if len(sys.argv) > 1 else 8025)
    print(sink.url, flush=True)
    sink.server.serve_forever()
