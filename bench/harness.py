"""The benchmark's plumbing: the server and its databases, the pgfence under
test, processes, and the one way every throughput run is measured (drain)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
#: The names of the databases a run creates (and drops, leftovers of an
#: earlier run included) start with this; PGFENCE_BENCH_PREFIX sets another,
#: so that two runs on one server do not drop each other's databases.
PREFIX = os.environ.get("PGFENCE_BENCH_PREFIX", "pgfence_bench_")
#: A run during which more than this share of the machine's CPU went to
#: something else than the system measured is marked disturbed.
DISTURBED = 0.20
#: Processes the harness runs for the workload itself (the io section's HTTP
#: server): their CPU is counted with the server side, not as "elsewhere".
WORKLOAD_PIDS: list[int] = []


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the pgfence under test -------------------------------------------------------


class Pgfence:
    """A pgfence checkout run with the project's interpreter: this repository
    by default, or another checkout (``--pgfence-root``) to measure a change
    before it lands.  The command is ``python -m pgfence`` run by the
    interpreter given (``--project-python``), in whose environment that
    checkout is installed (``pip install -e CHECKOUT``): its SQL, handlers
    and engine are then the ones used."""

    def __init__(self, root: Path, python: Path):
        self.root = root.resolve()
        self.python = python
        self.env = {**os.environ, "PGFENCE_BENCH_ROOT": str(self.root)}
        self._queries: dict[str, str] | None = None

    def cmd(self, *argv: str) -> list[str]:
        return [str(self.python), "-m", "pgfence", *argv]

    def popen(self, argv: list[str], logfile) -> subprocess.Popen:
        return subprocess.Popen(self.cmd(*argv), stdout=logfile, stderr=logfile, start_new_session=True,
                                cwd=self.root, env=self.env)

    def migrate(self, dsn: str) -> None:
        """pgfence's schema, then the example handlers' tables (the effect
        jobs write one), which pgfence's migrations do not create."""
        subprocess.run(self.cmd("migrate", "--dsn", dsn), check=True, stdout=subprocess.DEVNULL,
                       cwd=self.root, env=self.env)
        subprocess.run([str(self.python), "-m", "pgfence.handlers.tables", dsn], check=True,
                       stdout=subprocess.DEVNULL, cwd=self.root, env=self.env)

    def run(self, dsn: str, workers: int, batch: int, logfile, *extra: str) -> subprocess.Popen:
        # batch 0: no --batch, pgfence's default.
        return self.popen(["run", "--dsn", dsn, "--workers", str(workers),
                           *(["--batch", str(batch)] if batch else []), "--handlers", "pgfence.handlers.builtin", "--metrics-port", "0",
                           "--log-level", "WARNING", *extra], logfile)

    def queries(self) -> dict[str, str]:
        """The checkout's named SQL, split by its own loader."""
        if self._queries is None:
            # Split by the loader of the pgfence under test, which lives in
            # the project's interpreter, not in the benchmark's.
            script = ("import json, sys, pathlib; from pgfence.store.queries import parse; out = {}\n"
                      "for p in sorted(pathlib.Path(sys.argv[1]).glob('*.sql')): out.update(parse(p.read_text()))\n"
                      "print(json.dumps(out))")
            done = subprocess.run([str(self.python), "-c", script, str(self.root / "sql" / "queries")],
                                  capture_output=True, text=True, check=True, env=self.env)
            self._queries = json.loads(done.stdout)
        return self._queries

    def describe(self) -> str:
        def git(*argv: str) -> str:
            try:
                return subprocess.run(["git", *argv], cwd=self.root, capture_output=True, text=True,
                                      check=False).stdout.strip()
            except OSError:
                return ""
        commit = git("rev-parse", "--short", "HEAD") or "?"
        dirty = git("status", "--porcelain", "--untracked-files=no", "supervisor", "sql", "handlers")
        where = "" if self.root == BENCH.parent.resolve() else f" at {self.root}"
        return f"{commit}{' (modified)' if dirty else ''}{where}"


def claim_params(batch: int, worker: str = "bench", reclaim: bool = False) -> dict:
    """The claim's parameters as a worker sends them; ``reclaim`` false as in
    all but about one claim a second of each worker."""
    return {"queues": ["default"], "batch": batch, "worker": worker, "lease": 30.0,
            "lease_kinds": [], "lease_secs": [], "reclaim": reclaim, "kinds": None, "not_kinds": None}


# -- the database -------------------------------------------------------------------


class Server:
    """The PostgreSQL server under test, and the benchmark's databases on it."""

    def __init__(self, admin_dsn: str):
        self.admin_dsn = admin_dsn
        self.created: list[str] = []

    def dsn(self, db: str) -> str:
        """A URL (asyncpg takes no other form) for database ``db``."""
        info = psycopg.conninfo.conninfo_to_dict(self.admin_dsn)
        user = quote(str(info.get("user", "postgres")), safe="")
        if info.get("password"):
            user += ":" + quote(str(info["password"]), safe="")
        host = str(info.get("host", "127.0.0.1"))
        if host.startswith("/"):
            # A Unix socket's directory (the embedded server): a query
            # parameter, which psycopg and asyncpg both read.
            port = f"&port={info['port']}" if info.get("port") else ""
            return f"postgresql://{user}@/{quote(db)}?host={quote(host, safe='/')}{port}"
        return f"postgresql://{user}@{host}:{info.get('port', 5432)}/{quote(db)}"

    def admin(self, sql: str) -> list:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create(self, name: str) -> str:
        db = PREFIX + name
        self.admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        self.admin(f'CREATE DATABASE "{db}"')
        self.created.append(db)
        return self.dsn(db)

    def drop_all(self) -> None:
        for db in self.created:
            try:
                self.admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            except psycopg.Error as exc:
                log(f"could not drop {db}: {exc}")

    def drop_leftovers(self) -> None:
        for (db,) in self.admin(f"SELECT datname FROM pg_database WHERE datname LIKE '{PREFIX}%'"):
            self.admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def facts(self) -> dict:
        version = self.admin("SHOW server_version")[0][0]
        settings = dict(self.admin(
            "SELECT name, setting FROM pg_settings WHERE name IN ('synchronous_commit', 'shared_buffers', "
            "'max_connections', 'fsync', 'wal_level', 'max_wal_size')"))
        return {"server_version": version, "settings": settings}


def execute(dsn: str, *statements: str, params: tuple | dict | None = None) -> list:
    """Run statements in autocommit on a new connection; the last one's rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: list = []
        for sql in statements:
            cur = conn.execute(sql, params)
            rows = cur.fetchall() if cur.description else []
        return rows


def time_claims(conns: dict[str, psycopg.Connection], claim: str, complete: str, claims: int,
                warmup: int) -> dict[str, list[float]]:
    """The claim of one job (pgfence's statement, prepared), ``claims`` times
    on each connection after ``warmup`` untimed ones, alternating which goes
    first; each claimed job is completed at once.  Milliseconds per label."""
    times: dict[str, list[float]] = {label: [] for label in conns}
    labels = list(conns)
    for i in range(claims + warmup):
        for label in (labels if i % 2 == 0 else labels[::-1]):
            conn = conns[label]
            started = time.perf_counter()
            rows = conn.execute(claim, claim_params(1)).fetchall()
            elapsed = (time.perf_counter() - started) * 1000
            if len(rows) != 1:
                raise RuntimeError(f"a claim on the {label} table returned {len(rows)} rows")
            conn.execute(complete, {"id": rows[0][0], "attempt": rows[0][5]})
            if i >= warmup:
                times[label].append(elapsed)
    return times


def has_history(dsn: str) -> bool:
    """Whether pgfence's schema moves finished jobs out of pgfence.jobs into
    pgfence.job_history (migration 0009), whose jobs pgfence.all_jobs shows
    with the live ones."""
    return bool(execute(dsn, "SELECT to_regclass('pgfence.job_history') IS NOT NULL")[0][0])


def all_jobs(dsn: str) -> str:
    """The relation that holds every job, live or finished."""
    return "pgfence.all_jobs" if has_history(dsn) else "pgfence.jobs"


def fill_pgfence(dsn: str, n: int, kind: str = "noop", payload: str = "{}") -> None:
    """An empty pgfence table (and history), then N queued jobs in one
    statement, vacuumed, analyzed and checkpointed, so every run starts from
    the same state."""
    history = ", pgfence.job_history" if has_history(dsn) else ""
    execute(dsn,
            f"TRUNCATE pgfence.jobs{history}, pgfence_examples.effects, pgfence_examples.receipts RESTART IDENTITY",
            f"INSERT INTO pgfence.jobs (kind, payload) SELECT '{kind}', '{payload}'::jsonb "
            f"FROM generate_series(1, {int(n)})",
            "VACUUM ANALYZE pgfence.jobs",
            "CHECKPOINT")


# -- processes --------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / _TICK, sum(values[:8]) / _TICK


#: Seconds a run waits for a quiet machine at most (--quiet-timeout).
QUIET_TIMEOUT = [120.0]


def quiesce(limit: float = 0.25, timeout: float | None = None, sample: float = 0.5) -> float:
    """Wait (up to ``timeout`` s, by default QUIET_TIMEOUT) until the machine
    is quiet: less than ``limit`` of its CPU busy over ``sample`` s with
    nothing of ours running, so that another workload on the machine does
    not land in a measurement.  Returns the busy fraction last seen."""
    deadline = time.monotonic() + (QUIET_TIMEOUT[0] if timeout is None else timeout)
    warned = False
    while True:
        b0 = machine_busy()
        time.sleep(sample)
        b1 = machine_busy()
        busy = (b1[0] - b0[0]) / max(1e-9, b1[1] - b0[1])
        if busy < limit or time.monotonic() > deadline:
            return busy
        if not warned:
            log(f"  waiting for the machine to be quiet: {busy:.0%} of its CPU busy with something else")
            warned = True


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            out.append(kid)
            todo.append(kid)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def memory(pid: int) -> dict:
    """RSS, PSS, USS (private clean + private dirty) and shared, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key.strip()] = int(value.split()[0])        # kB
    mib = 1024.0
    return {"rss_mib": round(fields["Rss"] / mib, 2), "pss_mib": round(fields["Pss"] / mib, 2),
            "uss_mib": round((fields["Private_Clean"] + fields["Private_Dirty"]) / mib, 2),
            "shared_mib": round((fields["Shared_Clean"] + fields["Shared_Dirty"]) / mib, 2)}


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(pct / 100 * len(sorted_values) + 0.4999))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# -- throughput ---------------------------------------------------------------------------


@dataclass
class Run:
    """One drain of N jobs."""

    n: int
    done: int
    wall_s: float        # starting the workers -> the poll that found no job left
    window_s: float      # first job taken -> last job finished, database clock
    capped: bool
    cpu: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.done / self.window_s if self.window_s > 0 else 0.0

    @property
    def wall_rate(self) -> float:
        return self.done / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"n": self.n, "done": self.done, "wall_s": round(self.wall_s, 4), "window_s": round(self.window_s, 4),
                "jobs_per_s": round(self.rate, 1), "jobs_per_s_with_startup": round(self.wall_rate, 1),
                "capped": self.capped, "cpu": self.cpu, **self.extra}


@dataclass
class Series:
    """The runs of one system in one configuration; the median is its figure."""

    key: str
    system: str
    config: str
    n: int
    runs: list[Run] = field(default_factory=list)
    discarded: list[Run] = field(default_factory=list)   # disturbed runs done again
    reference: str = ""
    error: str | None = None

    @property
    def rate(self) -> float:
        return statistics.median(r.rate for r in self.runs) if self.runs else 0.0

    @property
    def wall_rate(self) -> float:
        return statistics.median(r.wall_rate for r in self.runs) if self.runs else 0.0

    @property
    def capped(self) -> bool:
        return any(r.capped for r in self.runs)

    @property
    def disturbed(self) -> bool:
        """Some run shared the machine with more than a fifth of it busy elsewhere."""
        return any(r.cpu.get("other_share", 0) > DISTURBED for r in self.runs)

    def cpu_per_1k(self) -> dict:
        """Median CPU milliseconds per 1,000 jobs, client and server side."""
        out = {}
        for key in ("client_ms_per_1k", "server_ms_per_1k"):
            values = [r.cpu[key] for r in self.runs if key in r.cpu]
            if values:
                out[key] = round(statistics.median(values), 1)
        return out

    def as_dict(self) -> dict:
        return {"system": self.system, "config": self.config, "n": self.n,
                "jobs_per_s": round(self.rate, 1), "jobs_per_s_with_startup": round(self.wall_rate, 1),
                "capped": self.capped, "disturbed": self.disturbed, "cpu_per_1k": self.cpu_per_1k(), "reference": self.reference,
                "error": self.error, "runs": [r.as_dict() for r in self.runs],
                "discarded_runs": [r.as_dict() for r in self.discarded]}


@dataclass
class Probe:
    """What the harness asks the system's tables during a drain."""

    left: str       # one boolean: is any job left?
    started: str    # one boolean: has any job been taken?
    window: str     # jobs done, seconds from first taken to last done (database clock)


def pgfence_probe(dsn: str) -> Probe:
    """pgfence's drain probe for the schema of ``dsn``: jobs left are read
    from pgfence.jobs, jobs taken and done from every job (pgfence.all_jobs
    where finished jobs move to history)."""
    table = all_jobs(dsn)
    return Probe(
        left="SELECT EXISTS (SELECT 1 FROM pgfence.jobs WHERE status IN ('queued', 'running'))",
        started=f"SELECT EXISTS (SELECT 1 FROM {table} WHERE started_at IS NOT NULL)",
        window=f"SELECT count(*) FILTER (WHERE status = 'done'), "
               f"extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM {table}",
    )

PGQUEUER_PROBE = Probe(
    left="SELECT EXISTS (SELECT 1 FROM pgqueuer)",
    started="SELECT EXISTS (SELECT 1 FROM pgqueuer_log WHERE status = 'picked')",
    window="SELECT count(*) FILTER (WHERE status = 'successful'), "
           "extract(epoch FROM max(created) FILTER (WHERE status = 'successful') "
           "- min(created) FILTER (WHERE status = 'picked'))::float8 FROM pgqueuer_log")

_BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")


def drain(dsn: str, n: int, cap: float, start: Callable[[], list[subprocess.Popen]], probe: Probe,
          stop: Callable[[list[subprocess.Popen]], None]) -> Run:
    """Start the workers, poll until no job is left (or ``cap`` seconds), stop
    them, and read on the database clock how long the work took.

    CPU is counted from the poll that first sees a job taken to the poll that
    sees none left: the workers' processes (client) and their PostgreSQL
    backends (server), and the whole machine's busy time, so start-up is
    left out and the split shows where a 2-core machine spends its cores."""
    quiet = quiesce()
    with psycopg.connect(dsn, autocommit=True) as poller:
        def ask(sql: str) -> bool:
            return bool(poller.execute(sql).fetchone()[0])

        t0 = time.monotonic()
        procs = start()
        try:
            return _drain(poller, ask, t0, procs, n, cap, probe, stop, quiet)
        finally:
            for proc in procs:      # an error or an interrupt: leave nothing running
                if proc.poll() is None:
                    stop_process(proc, signal.SIGTERM, 10)


def _drain(poller: psycopg.Connection, ask: Callable[[str], bool], t0: float, procs: list[subprocess.Popen],
           n: int, cap: float, probe: Probe, stop: Callable[[list[subprocess.Popen]], None], quiet: float) -> Run:
    """The polling loop of :func:`drain`."""
    capped, base = False, None
    backends: dict[int, float] = {}     # pid -> CPU seconds when counting began (or first seen)
    last: dict[int, float] = {}

    def client_pids() -> list[int]:
        return [p for proc in procs for p in (proc.pid, *descendants(proc.pid))]

    while True:
        for (pid,) in poller.execute(_BACKENDS).fetchall():
            last[pid] = cpu_seconds(pid)
            backends.setdefault(pid, last[pid])
        if base is None and ask(probe.started):
            base = (time.monotonic(), sum(cpu_seconds(p) for p in client_pids()), machine_busy(),
                    sum(cpu_seconds(p) for p in WORKLOAD_PIDS))
            backends = {pid: cpu_seconds(pid) for pid in backends}
        if not ask(probe.left):
            break
        if time.monotonic() - t0 > cap:
            capped = True
            break
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed:
            raise RuntimeError(f"a worker exited with status {failed[0].returncode} before the queue was empty")
        time.sleep(0.05)
    end = time.monotonic()
    client_end = sum(cpu_seconds(p) for p in client_pids())
    busy_end = machine_busy()
    workload_end = sum(cpu_seconds(p) for p in WORKLOAD_PIDS)
    for pid in backends:
        last[pid] = max(last.get(pid, 0.0), cpu_seconds(pid))
    if capped:
        for proc in procs:
            stop_process(proc, signal.SIGTERM, 10)
    else:
        stop(procs)
    done, window = poller.execute(probe.window).fetchone()
    done = int(done or 0)
    cpu: dict = {}
    if base is not None and done:
        span = end - base[0]
        client = client_end - base[1]
        server = sum(last[pid] - backends[pid] for pid in backends) + workload_end - base[3]
        busy_s = busy_end[0] - base[2][0]
        busy = busy_s / max(1e-9, busy_end[1] - base[2][1])
        # CPU spent by anything else (PostgreSQL's own background processes,
        # the harness, another workload on the machine), as a share of it.
        other = max(0.0, busy_s - client - server) / max(1e-9, span * (os.cpu_count() or 1))
        cpu = {"span_s": round(span, 3), "client_s": round(client, 3), "server_s": round(server, 3),
               "client_ms_per_1k": round(1e6 * client / done, 1), "server_ms_per_1k": round(1e6 * server / done, 1),
               "machine_busy": round(busy, 3), "other_share": round(other, 3), "busy_before": round(quiet, 3)}
    return Run(n=n, done=done, wall_s=end - t0, window_s=float(window or 0.0), capped=capped, cpu=cpu)


# -- profiles ---------------------------------------------------------------------------------


def fold(raw: str) -> dict:
    """The main thread's frames in a py-spy raw (collapsed) profile: the top
    ones inclusive and by own time, and own time by leaf module."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    by_module: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or stack.startswith("Thread._bootstrap"):
            continue    # another thread than the main one (the tick thread)
        n = int(count)
        total += n
        frames = [re.sub(r"\s*\(([\w./-]*?)([\w-]+\.py):\d+\)", r" (\2)", f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        m = re.search(r"\(([\w./-]+?)(?:\.py)?:\d+\)", stack.split(";")[-1])
        module = m.group(1).split("site-packages/")[-1].split("/")[0] if m else "?"
        by_module[module] = by_module.get(module, 0) + n

    def top(counts: dict[str, int]) -> list:
        # Frames in (nearly) every sample, the stack above Worker.run_once, say nothing.
        ranked = sorted(((f, c) for f, c in counts.items() if c < 0.97 * total), key=lambda x: -x[1])
        return [[f, round(100 * c / max(1, total), 1)] for f, c in ranked[:25]]

    def pct(frame: str) -> float:
        return round(100 * inclusive.get(frame, 0) / max(1, total), 1)

    # Waiting for PostgreSQL's answer is psycopg's Connection.wait; an idle
    # worker waits for work in Worker._wait_for_work.  The rest is Python.
    waiting = pct("Connection.wait (connection.py)")
    idle = pct("Worker._wait_for_work (worker.py)")
    python_own = {f: c for f, c in own.items() if f != "Connection.wait (connection.py)"}
    return {"samples": total, "waiting_for_postgresql_pct": waiting, "idle_pct": idle,
            "python_pct": round(100 - waiting - idle, 1) if waiting + idle < 100 else 0.0,
            "inclusive_pct": top(inclusive), "python_self_pct": top(python_own),
            "leaf_module_pct": top(by_module)}


# -- memory while draining, and drains counted by the workers themselves ----------------------


class PoolMemory:
    """Samples, every ``interval`` s on a thread of its own, the USS and RSS
    summed over each root process and all its descendants (the whole pool:
    a supervisor, its children, their helpers) while a drain runs.

    ``result()`` gives the largest sums seen and those of the sample nearest
    the middle of the sampling, in MiB, and the process count then."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.samples: list[tuple[float, float, float, int]] = []    # (t, uss, rss, processes)
        self._stop = None
        self._thread = None

    def start(self, procs: list[subprocess.Popen]) -> None:
        import threading

        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(self.interval):
                pids = [p for proc in procs if proc.poll() is None for p in (proc.pid, *descendants(proc.pid))]
                uss = rss = 0.0
                counted = 0
                for pid in pids:
                    try:
                        m = memory(pid)
                    except (OSError, KeyError, ValueError):
                        continue
                    uss += m["uss_mib"]
                    rss += m["rss_mib"]
                    counted += 1
                if counted:
                    self.samples.append((time.monotonic(), uss, rss, counted))

        self._thread = threading.Thread(target=sample, name="pool-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            self._stop = None

    def result(self) -> dict:
        self.stop()
        if not self.samples:
            return {}
        mid_t = (self.samples[0][0] + self.samples[-1][0]) / 2
        mid = min(self.samples, key=lambda s: abs(s[0] - mid_t))
        return {"uss_max_mib": round(max(s[1] for s in self.samples), 1),
                "rss_max_mib": round(max(s[2] for s in self.samples), 1),
                "uss_mid_mib": round(mid[1], 1), "rss_mid_mib": round(mid[2], 1),
                "processes": max(s[3] for s in self.samples), "samples": len(self.samples)}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def drain_counted(n: int, cap: float, start: Callable[[], list[subprocess.Popen]],
                  stop: Callable[[list[subprocess.Popen]], None], done: Callable[[], int],
                  window: Callable[[], tuple[int, float]]) -> Run:
    """:func:`drain` for systems outside PostgreSQL (a Redis broker): the
    tasks count themselves (``done``) and record their start and end, and
    ``window`` gives (tasks recorded, first start to last end) on the
    machine's clock.  CPU is the workers' processes only (no PostgreSQL)."""
    quiet = quiesce()
    servers = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
               and _comm(int(d.name)) == "redis-server"] + WORKLOAD_PIDS
    t0 = time.monotonic()
    procs = start()
    capped, base = False, None

    def client_pids() -> list[int]:
        return [p for proc in procs for p in (proc.pid, *descendants(proc.pid))]

    try:
        while True:
            count = done()
            if base is None and count > 0:
                base = (time.monotonic(), sum(cpu_seconds(p) for p in client_pids()), machine_busy(),
                        sum(cpu_seconds(p) for p in servers))
            if count >= n:
                break
            if time.monotonic() - t0 > cap:
                capped = True
                break
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                raise RuntimeError(f"a worker exited with status {failed[0].returncode} before all tasks ran")
            time.sleep(0.05)
        end = time.monotonic()
        client_end = sum(cpu_seconds(p) for p in client_pids())
        busy_end = machine_busy()
        server_end = sum(cpu_seconds(p) for p in servers)
        if capped:
            for proc in procs:
                stop_process(proc, signal.SIGTERM, 10)
        else:
            stop(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                stop_process(proc, signal.SIGTERM, 10)
    recorded, span_s = window()
    recorded = min(recorded, n)
    cpu: dict = {}
    if base is not None and recorded:
        span = end - base[0]
        client = client_end - base[1]
        busy_s = busy_end[0] - base[2][0]
        busy = busy_s / max(1e-9, busy_end[1] - base[2][1])
        server = server_end - base[3]          # redis-server and the workload's own processes
        other = max(0.0, busy_s - client - server) / max(1e-9, span * (os.cpu_count() or 1))
        cpu = {"span_s": round(span, 3), "client_s": round(client, 3), "server_s": round(server, 3),
               "client_ms_per_1k": round(1e6 * client / recorded, 1),
               "server_ms_per_1k": round(1e6 * server / recorded, 1),
               "machine_busy": round(busy, 3), "other_share": round(other, 3), "busy_before": round(quiet, 3)}
    return Run(n=n, done=recorded, wall_s=end - t0, window_s=span_s, capped=capped, cpu=cpu)
