"""The event loop a worker runs its ``async def`` handlers on.

One loop per worker, in a thread of its own, started only when a handler
module defines an async handler.  The worker's claiming thread hands it jobs
(:meth:`EventLoop.submit`) and reads its pulse: a small task stamps the time
every :data:`BEAT` seconds, so a loop that has not stamped for
:data:`BLOCKED_AFTER` seconds is held by a handler that blocks (a
``time.sleep`` or a synchronous HTTP call inside ``async def``), which the
worker logs with the kind of the job that holds it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

#: How often the loop stamps its pulse.
BEAT = 0.1
#: A loop silent this long (beyond one beat) is reported blocked.
BLOCKED_AFTER = 1.0

T = TypeVar("T")


class EventLoop:
    """An asyncio loop running in its own thread."""

    def __init__(self, name: str = "pgfence-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: When the loop last turned (monotonic), stamped by its pulse task.
        self.pulse = time.monotonic()
        self._ready = threading.Event()
        self._pulse_task: asyncio.Task[None]

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._pulse_task = self.loop.create_task(self._beat())
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _beat(self) -> None:
        while True:
            self.pulse = time.monotonic()
            await asyncio.sleep(BEAT)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future is done when it is."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, func: Callable[..., object], *args: object) -> None:
        """Call ``func(*args)`` on the loop's thread, soon."""
        self.loop.call_soon_threadsafe(func, *args)

    def silent_for(self, now: float | None = None, *, since: float | None = None) -> float:
        """Seconds since the loop last turned, beyond one beat; counted from
        ``since`` at the earliest (a time from which on the loop's silence
        means something)."""
        start = self.pulse if since is None else max(self.pulse, since)
        return max(0.0, (time.monotonic() if now is None else now) - start - BEAT)

    def running_task(self) -> asyncio.Task[Any] | None:
        """The task the loop is running now (the one that blocks it, when
        it is blocked)."""
        return asyncio.current_task(self.loop)

    def stop(self, timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        def halt() -> None:
            self._pulse_task.cancel()
            self.loop.call_soon(self.loop.stop)

        try:
            self.loop.call_soon_threadsafe(halt)
        except RuntimeError:   # closed meanwhile
            return
        self._thread.join(timeout)
