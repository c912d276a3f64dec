"""The dashboard's pages over a large history.

    python bench/web_pages.py [ADMIN_DSN] [JOBS] [--json]

Makes a scratch database holding JOBS jobs (default 1,000,000): 99 % of
them finished (one in ten failed, on three queues and two kinds) in
pgfence.job_history, evenly over the last day, in the order they finished
(as history is written), the rest queued in pgfence.jobs, then analyzed.  Each
page is asked of the real app (starlette's TestClient: routing, the store
queries and the template, no network) five times after a first, warming
request, and the median printed: the overview, the job list's first page,
the first and the 50th page of a filter (keyset: the 50th costs what the
first does), one job, and a bulk action's confirmation (a full count of the
filter).  Then the plan of the job list's first page: a Limit over a Merge
Append of backward scans of the id indexes.  With ``--json``, one JSON object
instead (``bench/run.sh``'s ``web`` section): each page's median and the plan.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from scratch import admin_dsn, argv, scratch_database
from starlette.testclient import TestClient

from pgfence.store import web as store
from pgfence.store.queries import q
from pgfence.web.app import create_app

FILL = """
INSERT INTO pgfence.job_history (status, queue, kind, last_error, attempt, started_at, finished_at, worker)
SELECT CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'done' END,
       (ARRAY['default', 'mail', 'reports'])[g %% 3 + 1],
       CASE WHEN g %% 7 = 0 THEN 'report' ELSE 'noop' END,
       CASE WHEN g %% 10 = 0 THEN 'RuntimeError: boom ' || g END, 1, at, at, 'bench:1:w'
  FROM generate_series(1, %(finished)s) g,
       LATERAL (SELECT now() - interval '1 day' + g * (interval '1 day' / %(finished)s)) AS spread(at)"""
LIVE = """
INSERT INTO pgfence.jobs (queue, kind)
SELECT (ARRAY['default', 'mail', 'reports'])[g %% 3 + 1], 'noop' FROM generate_series(1, %(live)s) g"""


def median_ms(client: TestClient, url: str, runs: int = 5) -> float:
    assert client.get(url).status_code == 200, url
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        client.get(url)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    admin, jobs = admin_dsn(), argv(2, 1_000_000)
    live = jobs // 100
    with scratch_database(admin, None) as conn:
        conn.execute(FILL, {"finished": jobs - live})
        conn.execute(LIVE, {"live": live})
        conn.execute("VACUUM ANALYZE pgfence.jobs")
        conn.execute("VACUUM ANALYZE pgfence.job_history")
        where = store.JobFilter(queue="mail", status="failed")
        before = None
        for _ in range(49):
            before = store.jobs_page(conn, where, before=before, limit=50)[-1].id
        some_job = store.jobs_page(conn, store.JobFilter(), before=None, limit=1)[0].id // 2
        dsn = conn.info.dsn
        params = {"before": None, "upto": None, "id": None, "queue": None, "kind": None, "status": None,
                  "dedupe_key": None, "error": None, "statuses": None, "limit": 51}
        plan = [r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + q("web_jobs_page"), params)]
        pages = [("overview", "/"), ("jobs, first page", "/jobs"),
                 ("jobs, queue=mail status=failed, first page", "/jobs?queue=mail&status=failed"),
                 ("jobs, queue=mail status=failed, 50th page", f"/jobs?queue=mail&status=failed&before={before}"),
                 ("one job", f"/jobs/{some_job}"),
                 ("bulk retry confirmation (count)", "/jobs/bulk?action=retry&queue=mail&status=failed")]
        app = create_app(dsn)
        try:
            with TestClient(app) as client:
                medians = {label: median_ms(client, url) for label, url in pages}
        finally:
            app.state.dashboard.close()
        if "--json" in sys.argv:
            print(json.dumps({"jobs": jobs, "pages_ms": medians, "plan": plan}))
            return
        print(f"| page ({jobs:,} jobs) | median ms |")
        print("|---|---:|")
        for label, ms in medians.items():
            print(f"| {label} | {ms:.1f} |")
        print()
        print("\n".join(plan))


if __name__ == "__main__":
    main()
