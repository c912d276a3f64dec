"""What a reload (SIGHUP) does besides starting new children: the handler
modules imported again, the schedules they declared kept if that fails, the
new settings capped to the slot table sized at start, and the heap frozen
again for the new children."""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pgfence import registry
from pgfence.errors import ConfigError
from pgfence.settings import Settings

log = logging.getLogger("pgfence.arbiter")


def freeze_heap() -> None:
    """Move every object the arbiter holds now (the handler modules and what
    they imported) out of the collector's reach, before children are forked.

    A child's collector would otherwise walk these objects and rewrite
    their GC headers as it moves them between generations, so copy-on-write
    would copy every page that holds one into each child; frozen, they are
    never examined, and the pages only the collector would have touched stay
    shared (the refcounts of objects a child actually uses still copy their
    pages).  Called once the handler modules are imported, and
    again after a reload re-imports them.  The arbiter's own later garbage
    is still collected (only what exists at the call is frozen)."""
    gc.freeze()


@contextmanager
def schedules_kept_on_failure() -> Iterator[None]:
    """Schedules declared in code are declared again by the modules' new
    import: one removed from them must enqueue nothing more.  If the reload
    fails, the running ones stay."""
    schedules = registry.schedules()
    registry.forget_schedules()
    try:
        yield
    except BaseException:
        registry.forget_schedules()
        for schedule in schedules:
            registry.periodic(schedule.name, schedule.kind, cron=schedule.cron, every=schedule.every,
                              tz=schedule.tz, payload=schedule.payload, queue=schedule.queue,
                              overlap=schedule.overlap, catch_up=schedule.catch_up,
                              catch_up_window=schedule.catch_up_window)
        raise


def reimport(handlers: tuple[str, ...]) -> None:
    """Import each handler module again (a ConfigError of one line if one
    fails)."""
    for name in handlers:
        module = sys.modules.get(name)
        try:
            if module is not None:
                importlib.reload(module)
            else:
                registry.load([name])
        except ConfigError as exc:
            raise ConfigError(f"cannot re-import handler module {name!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any import error
            raise ConfigError(f"cannot re-import handler module {name!r}: {type(exc).__name__}: {exc}") from None


def capped(settings: Settings, njobs: int) -> Settings:
    """``settings`` within the slot table sized at start (``njobs`` entries
    per slot): a reload cannot grow what a child may hold beyond it."""
    with_async = registry.has_async()
    # (twice the capacity: a job ended but not yet completed keeps
    # its entry while its slot takes another).
    most = njobs // 2
    if settings.claim_size(with_async) > njobs or settings.capacity(with_async) > most:
        log.warning("reload: threads and async-concurrency are capped at %d jobs per worker and batch at "
                    "%d, the sizes set at start; restart pgfence to raise them", most, njobs)
        threads = min(settings.threads, most)
        settings = settings.replace(
            batch=None if settings.batch is None else min(settings.batch, njobs), threads=threads,
            async_concurrency=max(1, min(settings.async_concurrency, most - threads)))
    return settings
