"""Real ``pgfence run`` supervisors for tests: one helper for every test
module that starts them.

A :class:`Supervisor` is one ``pgfence run`` subprocess on the test's
database, with a label, its arguments and its log (stdout and stderr) in a
file of the test's tmp folder, which is put at the front of the children's
``PYTHONPATH`` (so a handler module written there is importable).  Its
children are read from ``/proc/PID/task/PID/children`` and told apart by
their process titles (``pgfence worker 3 ...``, ``pgfence heartbeat [7
leases]``); every child ever seen is remembered with its start time, so the
cleanup kills them all, also those a killed arbiter left behind, and never
a process that got a reused pid.

:func:`supervisor_fixture` makes a ``supervisors`` fixture: a function that
starts supervisors with the module's default options (``--name value``
flags from keyword arguments: ``lost_lease_kill_after=1`` is
``--lost-lease-kill-after 1``, None leaves a flag out); every arbiter and
child is killed when the test ends, and none may be left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from metricstools import http_get, samples
from pgtools import env_for, spawn, started, state, title, wait_for

#: What makes a supervisor's default options for a test: a mapping, or a
#: function of the test's tmp folder.
Defaults = Mapping[str, Any] | Callable[[Path], Mapping[str, Any]]


def flags(options: Mapping[str, Any]) -> list[str]:
    """``--name value`` for each option that is not None."""
    args: list[str] = []
    for name, value in options.items():
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args


class Supervisor:
    """One ``pgfence run`` process, its log in a file; cleaned up by the
    fixture, children included."""

    def __init__(self, dsn: str, tmp_path: Path, label: str, args: list[str],
                 env: Mapping[str, str] | None = None, port: int | None = None):
        self.label = label
        self.args = args
        #: The metrics port given with --metrics-port, if any.
        self.port = port
        self.log_path = tmp_path / f"{label}.log"
        environ = env_for(dsn, **dict(env or {}))
        environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), environ["PYTHONPATH"]])
        with open(self.log_path, "w") as log:
            self.proc = spawn("run", *args, env=environ, stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        #: Every child ever seen (pid -> start time), for the final check
        #: that none is left.
        self.seen: dict[int, int] = {}

    def log(self) -> str:
        return self.log_path.read_text()

    # -- processes -------------------------------------------------------------

    def children(self) -> dict[int, str]:
        """pid -> title of the arbiter's live children."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return {}
        out = {}
        for pid in map(int, text.split()):
            name, start = title(pid), started(pid)
            if name is not None and start is not None and state(pid) not in ("Z", "X"):
                out[pid] = name
                self.seen.setdefault(pid, start)
        return out

    def alive(self, pid: int) -> bool:
        """True while the child ``pid`` seen before runs (not a zombie, and
        not another process that got its pid)."""
        return (pid in self.seen and started(pid) == self.seen[pid]
                and state(pid) not in (None, "Z", "X"))

    def workers(self) -> dict[int, str]:
        """pid -> title of the live worker children."""
        return {p: t for p, t in self.children().items() if t.startswith("pgfence worker ")}

    def heartbeat(self) -> int | None:
        """The pid of the renewal process (the heartbeat manager), or None."""
        pids = [p for p, t in self.children().items() if t.startswith("pgfence heartbeat")]
        assert len(pids) <= 1, self.children()
        return pids[0] if pids else None

    def title(self) -> str:
        return title(self.pid) or ""

    # -- waiting -----------------------------------------------------------------

    def wait(self, condition: Callable[[], Any], timeout: float, message: str, interval: float = 0.02) -> Any:
        """wait_for (poll until truthy, fail at the deadline), with the
        supervisor's log in the failure."""
        try:
            return wait_for(condition, timeout=timeout, interval=interval, message=message)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.label} log ---\n{self.log()}") from None

    def wait_workers(self, n: int, timeout: float = 20) -> dict[int, str]:
        """Wait for exactly ``n`` worker children and a heartbeat manager."""
        return self.wait(lambda: len(w := self.workers()) == n and self.heartbeat() and w,
                         timeout, f"{n} worker children and a heartbeat manager")

    def wait_ready(self, workers: int, timeout: float = 30) -> None:
        """Its workers and heartbeat manager forked, and /readyz says ready
        (needs a metrics port)."""
        self.wait(lambda: len(self.workers()) == workers and self.heartbeat() is not None
                  and http_get(self.url("/readyz"))[0] == 200,
                  timeout, f"{workers} workers, a heartbeat manager and /readyz")

    # -- the metrics endpoint ------------------------------------------------------

    def url(self, path: str) -> str:
        assert self.port is not None, f"{self.label} has no metrics port"
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The parsed /metrics, or {} when the scrape fails (for polling)."""
        status, text = http_get(self.url("/metrics"))
        return samples(text) if status == 200 else {}

    # -- signals and the end --------------------------------------------------------

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        """The arbiter's exit status, once it has exited."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.label} still running after {timeout}s:\n{self.log()}") from None

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM; its exit status once it has exited."""
        self.children()
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def cleanup(self) -> list[int]:
        """Kill the arbiter and every child; return the pids still alive."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGSTOP)      # it forks no more
            self.children()
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in self.seen:
            if self.alive(pid):
                try:
                    os.kill(pid, signal.SIGCONT)   # a stopped process dies only once resumed
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while any(self.alive(p) for p in self.seen) and time.monotonic() < deadline:
            time.sleep(0.02)
        return [p for p in self.seen if self.alive(p)]


def supervisor_fixture(defaults: Defaults | None = None,
                       prepare: Callable[[Path], None] | None = None) -> Any:
    """A ``supervisors`` fixture: ``start(label="run", env=None, args=(), **options)``
    starts a :class:`Supervisor` labelled ``label`` and a number (its log is
    ``<label><n>.log``) with ``defaults`` overridden by ``options``;
    ``args`` are more flags, after those; ``prepare(tmp_path)`` runs once first (to write a handler module).  A
    ``metrics_port`` option is the supervisor's ``port``."""

    @pytest.fixture
    def supervisors(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
        if prepare is not None:
            prepare(tmp_path)
        made: list[Supervisor] = []

        def start(label: str = "run", *, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
                  **options: Any) -> Supervisor:
            base = defaults(tmp_path) if callable(defaults) else (defaults or {})
            merged = {**base, **options}
            port = merged.get("metrics_port")
            sup = Supervisor(dsn, tmp_path, f"{label}{len(made)}", [*flags(merged), *args], env=env,
                             port=port if isinstance(port, int) and port else None)
            made.append(sup)
            return sup

        try:
            yield start
        finally:
            left = [pid for sup in made for pid in sup.cleanup()]
            assert not left, f"processes left behind: {left}"

    return supervisors


#: ``pgfence run`` with the utility handlers (loaded by default, see
#: pgtools.env_for) and the flags given.
supervisors = supervisor_fixture()
