"""``pgfence demo``: the double run, without and with pgfence's protections.

Three acts, each with an email API of its own (a :class:`MailSink` on
loopback), a queue of its own and one ``send_receipt`` job, run by two real
worker processes, demo-A and demo-B:

1. Protections off (``pgfence work --unprotected``): nothing renews demo-A's
   lease, so demo-B reclaims the job while demo-A still renders; both send
   the email and both commit a receipt.  The email API gets two requests but
   sends one email, thanks to the idempotency key.
2. Protections on: demo-A's heartbeat renews its lease; one request, one
   receipt, and demo-B never gets the job.
3. demo-A is frozen (SIGSTOP) just after sending the email and before
   committing its receipt, and stays frozen past its lease; demo-B reclaims
   the job as attempt 2.  Resumed, demo-A commits: the fence (job id,
   attempt) matches no row and its receipt insert is rolled back.  The job
   renders only briefly here (at most half a lease): the pause, not the work,
   outlasts the lease.

The demo only adds rows (one job per act on a queue of its own, and the
receipts its workers write) and counts by the ids of the jobs it enqueued,
so it is safe on a database that holds other jobs.  It never prints the DSN
(the workers get it through their environment, not their command line).
"""

from __future__ import annotations

import re
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from pgfence.store import db
from pgfence.store import migrate
from pgfence.handlers.tables import create_tables
from pgfence.errors import ConfigError, SchemaMissing
from pgfence.producer import enqueue
from pgfence.tools.demo import store as demo_store
from pgfence.tools.demo.acts import Act, table
from pgfence.tools.demo.cast import Sink, Worker, worker_env

TERMINAL = ("done", "failed", "cancelled")
#: Seconds between two looks at the database while waiting.
POLL = 0.05
#: Seconds a worker may take to start and claim the job.
STARTUP = 30.0
#: Slack added to every deadline computed from the lease and render times.
SLACK = 20.0
#: Seconds a worker gets to exit after SIGTERM before it is killed.
STOP_GRACE = 5.0

_LOST = re.compile(r"job (\d+) attempt (\d+) lost its lease \((\w+)\)")


class _Demo:
    def __init__(self, dsn: str, lease: float, render: float, out: TextIO, workdir: Path):
        self.dsn = dsn
        self.lease = lease
        self.render = render
        self.out = out
        self.workdir = workdir
        self.tag = secrets.token_hex(3)
        self.conn = db.connect(dsn, application_name="pgfence demo")

    def close(self) -> None:
        self.conn.close()

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # -- the database, by the demo's own job ids --------------------------------

    def job(self, job_id: int) -> demo_store.DemoJob:
        with db.translated():
            row = demo_store.job(self.conn, job_id)
        return row if row is not None else demo_store.DemoJob("missing", 0, None)

    def receipts(self, job_id: int) -> list[int]:
        with db.translated():
            return demo_store.receipts(self.conn, job_id)

    def settled(self, job_id: int) -> bool:
        """Finished, and every attempt of it has committed its receipt."""
        status, attempt, _owner = self.job(job_id)
        return status in TERMINAL and len(self.receipts(job_id)) >= attempt

    def wait(self, act: Act, what: str, condition: Callable[[], Any], timeout: float) -> Any:
        """Poll ``condition`` until it is truthy; on the deadline record a problem and return None."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                act.problems.append(f"timed out after {timeout:.0f}s waiting for {what}")
                self.say(f"  timed out waiting for {what}")
                return None
            time.sleep(POLL)

    # -- one act ------------------------------------------------------------------

    def act(self, act: Act, *, protected: bool, render: float,
            script: Callable[[Act, Sink, dict[str, Worker], float], None],
            on_sink: Callable[[Sink, dict[str, Worker]], None] | None = None) -> Act:
        started = time.monotonic()
        sink = Sink().start()
        workers: dict[str, Worker] = {}
        queue = f"pgfence-demo-{self.tag}-{act.number}"
        env = worker_env(self.dsn, sink.url)

        def start(name: str) -> Worker:
            workers[name] = Worker(name, protected=protected, lease=self.lease, queue=queue, env=env,
                                    log_path=self.workdir / f"act{act.number}-{name}.log")
            return workers[name]

        try:
            if on_sink is not None:
                on_sink(sink, workers)
            start("demo-A")
            payload: dict[str, Any] = {"order_id": f"demo-{self.tag}-{act.number}", "email": "customer@example.com",
                       "amount_cents": 1250, "render_seconds": render}
            act.job_id = job_id = enqueue(self.conn, "send_receipt", payload, queue=queue, max_attempts=5)
            claimed = self.wait(act, "demo-A to claim the job",
                                lambda: self.job(job_id)[::2] == ("running", "demo-A"), STARTUP)
            if claimed:
                claimed_at = time.monotonic()
                self.say(f"  job {job_id} claimed by demo-A as attempt 1; demo-B starts")
                start("demo-B")
                script(act, sink, workers, claimed_at)
        finally:
            deadline = time.monotonic() + STOP_GRACE
            for worker in workers.values():
                worker.terminate()
            for worker in workers.values():
                worker.wait(deadline)
            sink.stop()
        if act.job_id is not None:
            act.status, act.attempt, _owner = self.job(act.job_id)
            act.receipt_attempts = self.receipts(act.job_id)
        act.requests, act.sent = sink.requests, sink.sent
        act.logs = {name: worker.log() for name, worker in workers.items()}
        for text in act.logs.values():
            for job_id, attempt, reason in _LOST.findall(text):
                if int(job_id) == act.job_id:
                    act.lost.append((int(attempt), reason))
        act.seconds = time.monotonic() - started
        self.say(f"  act {act.number} took {act.seconds:.1f}s")
        return act

    def act1(self) -> Act:
        act = Act(1, "1 without renewal+fence",
                  {"receipts": [1, 2], "requests": 2, "sent": 1, "status": "done", "attempt": 2, "lost": []})
        self.say(f"act 1: protections off: no lease renewal, completion by job id alone "
                 f"({self.lease:g}s lease, {self.render:g}s render)")

        def script(act: Act, sink: Sink, workers: dict[str, Worker], claimed_at: float) -> None:
            job_id = act.job_id
            assert job_id is not None   # enqueued before the script runs
            if self.wait(act, "demo-B to reclaim the job", lambda: self.job(job_id)[1] >= 2,
                         self.lease + self.render + SLACK):
                self.say(f"  nothing renewed the lease: demo-B reclaimed job {job_id} as attempt 2 "
                         f"{time.monotonic() - claimed_at:.1f}s after the claim, while demo-A still renders")
            if self.wait(act, "both attempts to finish", lambda: self.settled(job_id),
                         self.lease + self.render + SLACK):
                self.say(f"  both attempts sent the email and committed a receipt "
                         f"(email API: {sink.requests} requests, {sink.sent} email sent)")

        return self.act(act, protected=False, render=self.render, script=script)

    def act2(self) -> Act:
        act = Act(2, "2 with renewal+fence",
                  {"receipts": [1], "requests": 1, "sent": 1, "status": "done", "attempt": 1, "lost": []})
        self.say(f"act 2: protections on: lease renewed every {self.lease / 3:.2g}s, "
                 f"completion fenced by (job id, attempt)")

        def script(act: Act, sink: Sink, workers: dict[str, Worker], claimed_at: float) -> None:
            job_id = act.job_id
            assert job_id is not None   # enqueued before the script runs
            if self.wait(act, "the job to finish", lambda: self.settled(job_id),
                         self.lease + self.render + SLACK):
                status, attempt, _owner = self.job(job_id)
                self.say(f"  job {job_id} {status} as attempt {attempt} "
                         f"{time.monotonic() - claimed_at:.1f}s after the claim "
                         f"(email API: {sink.requests} request)")

        return self.act(act, protected=True, render=self.render, script=script)

    def act3(self) -> Act:
        act = Act(3, "3 paused past its lease",
                  {"receipts": [2], "requests": 2, "sent": 1, "status": "done", "attempt": 2,
                   "lost": [(1, "fence_rejected")]})
        render = min(self.render, self.lease / 2)
        self.say(f"act 3: protections on, a {render:g}s render; demo-A freezes (SIGSTOP) after sending "
                 f"the email, before committing")
        paused = threading.Event()

        def on_sink(sink: Sink, workers: dict[str, Worker]) -> None:
            def freeze_sender(attempt: int | None) -> None:
                # Runs in the email API before it answers attempt 1: demo-A has
                # passed its last check() and waits for the response.
                if attempt == 1 and not paused.is_set():
                    workers["demo-A"].pause()
                    paused.set()
            sink.on_post = freeze_sender

        def script(act: Act, sink: Sink, workers: dict[str, Worker], claimed_at: float) -> None:
            job_id = act.job_id
            assert job_id is not None   # enqueued before the script runs
            worker_a = workers["demo-A"]
            if not self.wait(act, "demo-A to send the email", paused.is_set, render + SLACK):
                return
            frozen_at = time.monotonic()
            self.say("  demo-A sent the email and froze before committing its receipt")
            reclaimed = self.wait(act, "demo-B to reclaim the job",
                                  lambda: self.job(job_id)[1] >= 2, self.lease + SLACK)
            if reclaimed:
                self.say(f"  its lease ran out: demo-B reclaimed job {job_id} as attempt 2 "
                         f"{time.monotonic() - frozen_at:.1f}s into the freeze")
            worker_a.resume()
            self.say("  demo-A resumes (SIGCONT) and tries to commit its receipt")

            def a_done() -> bool:
                status = self.job(job_id)[0]
                a_rejected = re.search(rf"job {job_id} attempt 1 lost its lease", worker_a.log())
                return status in TERMINAL and (a_rejected is not None or 1 in self.receipts(job_id))

            if self.wait(act, "demo-A's commit and demo-B's attempt to end", a_done, render + SLACK):
                if 1 in self.receipts(job_id):
                    self.say("  demo-A's late receipt was committed")
                else:
                    self.say("  the fence rejected demo-A's late commit: its receipt insert was rolled back")

        return self.act(act, protected=True, render=render, script=script, on_sink=on_sink)


def check_options(lease: float, render: float) -> None:
    """Refuse a lease and render time that cannot tell the story."""
    if not lease > 0 or not render > 0:
        raise ConfigError("invalid --lease/--render: must be positive")
    if render < lease + 1:
        raise ConfigError(f"invalid --render: the job must render at least a second longer than the lease "
                          f"({lease:g}s) for the double run to happen, got {render:g}s")


def run(dsn: str, *, lease: float = 3, render: float = 10, out: TextIO | None = None) -> int:
    """Tell the story, print what happened, and return 0 when it went as told, else 1."""
    out = out or sys.stdout
    check_options(lease, render)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pgfence-demo-") as workdir:
        demo = _Demo(dsn, float(lease), float(render), out, Path(workdir))
        try:
            if migrate.pending(demo.conn):
                raise SchemaMissing("pgfence schema missing or out of date: run 'pgfence migrate'")
            # The receipts table is the example's own, not pgfence's.
            with db.translated():
                create_tables(demo.conn)
            demo.say(f"pgfence demo on {db.redact(dsn)}: two workers, demo-A and demo-B")
            acts = [demo.act1(), demo.act2(), demo.act3()]
        finally:
            demo.close()
    elapsed = time.monotonic() - started
    print(file=out)
    print(table(acts), file=out)
    print(file=out)
    print("emails sent: distinct Idempotency-Keys; the email API answers a repeated key without sending again.",
          file=out)
    failed = [(act, act.mismatches()) for act in acts if act.mismatches()]
    for act, problems in failed:
        print(f"UNEXPECTED in act {act.number}: " + "; ".join(problems), file=out)
        for name, text in act.logs.items():
            tail = text.strip().splitlines()[-5:]
            for line in tail:
                print(f"  {name}: {line}", file=out)
    if not failed:
        print("as told: without the protections the receipt was committed twice; with them once, "
              "even when the worker froze past its lease.", file=out)
    print(f"demo took {elapsed:.1f}s", file=out, flush=True)
    return 1 if failed else 0
