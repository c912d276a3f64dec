"""``pgfence web``: the checks before the dashboard listens, and uvicorn.

Imported by the command line before the ``web`` extra is known to be
installed, so that its absence is one line: nothing here imports starlette,
jinja2 or uvicorn at module level.
"""

from __future__ import annotations

import importlib.util
import signal
import socket

from pgfence.errors import ConfigError
from pgfence.web.auth import is_loopback

#: The import names of the web extra's packages (python-multipart installs
#: ``python_multipart``, and ``multipart`` in its older releases).
EXTRA_MODULES = (("starlette",), ("jinja2",), ("uvicorn",), ("python_multipart", "multipart"))


def check_host(host: str, password: str | None) -> None:
    """Refuse an address other than loopback without a password."""
    if not password and not is_loopback(host):
        raise ConfigError(f"pgfence web: --host {host} is not a loopback address: set PGFENCE_WEB_PASSWORD "
                          "(every page then asks for it), or listen on 127.0.0.1")


def check_installed() -> None:
    """Refuse to start without the ``web`` extra's packages."""
    missing = [names[0] for names in EXTRA_MODULES if not any(importlib.util.find_spec(n) for n in names)]
    if missing:
        raise ConfigError(f"pgfence web needs the web extra (missing: {', '.join(missing)}): "
                          "pip install 'pgfence[web]'")


def shown_host(host: str) -> str:
    """``host`` as written in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now, so that an address in use is one
    clear line before anything else starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host.strip("[]"), port), family=family)
    except OSError as exc:
        raise ConfigError(f"pgfence web: cannot listen on {shown_host(host)}:{port}: "
                          f"{exc.strerror or exc}") from None
    return sock


def run(sock: socket.socket, dsn: str, *, read_only: bool, redact_payloads: bool, password: str | None,
        log_level: str) -> int:
    """Serve the dashboard on ``sock`` until SIGINT or SIGTERM."""
    import uvicorn

    from pgfence.web.app import create_app

    app = create_app(dsn, read_only=read_only, redact_payloads=redact_payloads, password=password)
    # uvicorn keeps pgfence's logging (log_config None): its lines go
    # through the root logger, from WARNING up unless DEBUG.  Its access
    # log names every URL, filters included: only at DEBUG.
    config = uvicorn.Config(app, log_config=None, log_level=log_level.lower(), access_log=log_level == "DEBUG",
                            server_header=False, proxy_headers=False, lifespan="off")
    server = uvicorn.Server(config)
    # uvicorn handles SIGINT and SIGTERM (it stops taking connections and
    # finishes the requests in flight), then raises the signal again for the
    # handler it found.  That handler only records it: a stop asked for is a
    # clean exit (status 0), not a death by signal.
    stops: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, _frame: stops.append(number))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        # The runner of bulk actions starts now, not at the first request:
        # a restarted dashboard takes up the actions its predecessor left.
        app.state.dashboard.start()
        server.run(sockets=[sock])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        app.state.dashboard.close()
        sock.close()
    return 0
