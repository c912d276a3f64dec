"""A blackholing TCP proxy on loopback in front of PostgreSQL.

Each *link* is one listening port on 127.0.0.1 (one per supervisor, or one
for PgBouncer); every connection to it is forwarded, byte for byte, to the
server (a TCP address or a Unix socket).  :meth:`Proxy.partition` cuts a
link the way a broken network does, not the way a crash does: nothing is
forwarded in either direction and no socket is closed, new connections are
accepted by the kernel and then left unanswered, until :meth:`Proxy.heal`
lets the bytes held so far through.

The proxy also learns the PostgreSQL backend pid of every connection it
carries (the server's BackendKeyData message, read as it passes), so that
the ``terminate`` fault can pick backends of this load test and no others.
For that it answers an SSL or GSS encryption request with "no" itself
(loopback needs neither), so the startup stays readable.

It runs an asyncio loop in a daemon thread; its methods are called from the
load test's main thread.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
#: Bytes of server messages read for the backend pid before giving up.
SCAN_LIMIT = 1 << 20


@dataclass
class Link:
    index: int
    port: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def cut(self) -> bool:
        return not self.gate.is_set()


class _BackendKey:
    """Finds BackendKeyData ('K': pid, secret) in the first server messages."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.done = False
        self.pid: int | None = None

    def feed(self, data: bytes) -> int | None:
        if self.done:
            return None
        self.buf += data
        while len(self.buf) >= 5:
            kind = self.buf[0]
            length = int.from_bytes(self.buf[1:5], "big")
            if kind == ord("K") and len(self.buf) >= 9:
                self.done = True
                self.pid = int.from_bytes(self.buf[5:9], "big")
                return self.pid
            if kind in (ord("Z"), ord("E")) or length < 4 or len(self.buf) > SCAN_LIMIT:
                self.done = True
                return None
            if len(self.buf) < 1 + length:
                return None
            del self.buf[: 1 + length]
        return None


class Proxy:
    def __init__(self, upstream: str | tuple[str, int]):
        #: A Unix socket path, or (host, port) on loopback.
        self.upstream = upstream
        self.links: list[Link] = []
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._pids: dict[int, int] = {}          # backend pid -> link index
        self._lock = threading.Lock()

    # -- control, from any thread ------------------------------------------------

    def start(self, links: int) -> list[int]:
        """Open ``links`` listening ports on 127.0.0.1; return them."""
        self._thread = threading.Thread(target=self._loop.run_forever, name="pgfence-loadtest-proxy", daemon=True)
        self._thread.start()
        return self._call(self._listen(links))

    def partition(self, index: int) -> None:
        self._call_soon(self._cut, index)

    def heal(self, index: int) -> None:
        self._call_soon(self._heal, index)

    def backend_pids(self) -> set[int]:
        """PostgreSQL backend pids of the connections open through the proxy."""
        with self._lock:
            return set(self._pids)

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            self._call(self._shutdown(), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._thread = None
            self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float = 30) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _call_soon(self, func: Callable[..., object], *args: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                func(*args)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- in the loop ---------------------------------------------------------------

    async def _listen(self, count: int) -> list[int]:
        for index in range(count):
            link = Link(index)
            link.gate.set()
            server = await asyncio.start_server(functools.partial(self._accept, link),
                                                "127.0.0.1", 0, backlog=1024)
            link.port = server.sockets[0].getsockname()[1]
            self.links.append(link)
            self._servers.append(server)
        return [link.port for link in self.links]

    def _cut(self, index: int) -> None:
        self.links[index].gate.clear()

    def _heal(self, index: int) -> None:
        self.links[index].gate.set()

    def _accept(self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(link, reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, link: Link, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        swriter: asyncio.StreamWriter | None = None
        key = _BackendKey()
        try:
            await link.gate.wait()
            first = await self._startup(creader, cwriter, link)
            if isinstance(self.upstream, str):
                sreader, swriter = await asyncio.open_unix_connection(self.upstream)
            else:
                sreader, swriter = await asyncio.open_connection(*self.upstream)
            swriter.write(first)
            pumps = [asyncio.ensure_future(self._pump(creader, swriter, link)),
                     asyncio.ensure_future(self._pump(sreader, cwriter, link, key, link.index))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError, EOFError):
            pass
        finally:
            if key.pid is not None:
                with self._lock:
                    self._pids.pop(key.pid, None)
            for w in (cwriter, swriter):
                if w is not None:
                    w.close()

    async def _startup(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> bytes:
        """Answer SSL/GSS encryption requests with 'N'; return the first 8
        bytes of the real startup (or cancel) packet."""
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            if length == 8 and code in (SSL_REQUEST, GSSENC_REQUEST):
                await link.gate.wait()
                writer.write(b"N")
                await writer.drain()
                continue
            return head

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link,
                    key: _BackendKey | None = None, index: int = 0) -> None:
        while True:
            await link.gate.wait()
            data = await reader.read(65536)
            if not data:
                return
            if key is not None and not key.done:
                pid = key.feed(data)
                if pid is not None:
                    with self._lock:
                        self._pids[pid] = index
            await link.gate.wait()
            writer.write(data)
            await writer.drain()

    async def _shutdown(self) -> None:
        for link in self.links:
            link.gate.set()
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
