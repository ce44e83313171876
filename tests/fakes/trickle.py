"""A server that never finishes an answer: headers, then one body byte every 100 ms, forever.

For the total deadlines of every pre-run probe (the driver's preflight, the profiler API's
detection): a per-read timeout never fires against it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def trickle_server() -> Iterator[str]:
    """Answers every request with headers, then one body byte every 100 ms, forever."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve(c: socket.socket) -> None:
        with c:
            try:
                c.recv(65536)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                c.sendall(b"Content-Length: 100000000\r\n\r\n{")
                while not stop.wait(0.1):
                    c.sendall(b" ")
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        srv.close()
