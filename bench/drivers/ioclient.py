"""The io section's HTTP clients, standard library only (pgfence's handlers
import them too, so nothing here may need the benchmark's venv).

Sync: one keep-alive ``http.client.HTTPConnection`` per thread.  Async: a
per-event-loop pool of keep-alive connections opened with
``asyncio.open_connection``, a minimal HTTP/1.1 GET each.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import threading


async def read_message(reader: asyncio.StreamReader) -> bytes:
    """Read one HTTP/1.1 message (head, then a Content-Length body) off
    ``reader``; its head.  Shared by the client here and the server."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:].strip() or 0)
    if length:
        await reader.readexactly(length)
    return head


HOST = "127.0.0.1"
REQUEST = b"GET /wait HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"


def port() -> int:
    return int(os.environ["PGFENCE_BENCH_HTTP_PORT"])


_local = threading.local()


def get_sync() -> int:
    """One GET on this thread's connection (reopened once if it was closed)."""
    for attempt in (0, 1):
        conn = getattr(_local, "conn", None)
        if conn is None:
            conn = _local.conn = http.client.HTTPConnection(HOST, port(), timeout=30)
        try:
            conn.request("GET", "/wait")
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (http.client.HTTPException, OSError):
            conn.close()
            _local.conn = None
            if attempt:
                raise
    raise AssertionError("unreachable")


_pools: dict[int, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}


async def get_async() -> int:
    """One GET on an idle pooled connection of this loop, or a new one."""
    idle = _pools.setdefault(id(asyncio.get_running_loop()), [])
    for attempt in (0, 1):
        if idle and attempt == 0:
            reader, writer = idle.pop()
        else:
            reader, writer = await asyncio.open_connection(HOST, port())
        try:
            writer.write(REQUEST)
            head = await read_message(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            if attempt:
                raise
            continue
        idle.append((reader, writer))
        return int(head.split(b" ", 2)[1])
    raise AssertionError("unreachable")
