"""A handler's return value stored as its job's result (pgfence.results,
migration 0014), in every mode: the one-job loop, threads, async and a
mixed module's def and async kinds; through the completion the worker
makes (batched or not) and after a fenced block the handler made itself;
None and result=False store nothing; a result that cannot be stored fails
a job not yet completed at once, and leaves a completed one done."""

from __future__ import annotations

import pytest

from pgtools import wait_for
from pgfence import ResultRejected, get_job
from pgfence.results import MAX_BYTES, encode
from supervisors import supervisor_fixture

supervisors = supervisor_fixture(defaults={"lease": 10, "poll_interval": 0.2, "backoff_base": 0.2,
                                           "backoff_max": 0.5})

MODES = {
    "loop": ({"handlers": "results_sync_handlers", "workers": 1, "threads": 1}, ["r"]),
    "threads": ({"handlers": "results_sync_handlers", "workers": 1, "threads": 4}, ["r"]),
    "async": ({"handlers": "results_async_handlers", "workers": 1, "async_concurrency": 8}, ["a"]),
    "mixed": ({"handlers": "results_mixed_handlers", "workers": 1, "threads": 4, "async_concurrency": 8},
              ["r", "a"]),
}
NAMES = ("value", "fenced", "none", "off", "big", "nan", "fenced_unstorable")


# -- encode: pure ---------------------------------------------------------------------


def test_encode_stores_json_compactly_and_nothing_for_none_or_when_off():
    assert encode({"a": [1, 2.5, "é", None, True]}) == '{"a":[1,2.5,"\\u00e9",null,true]}'
    assert encode("done") == '"done"' and encode(0) == "0" and encode([]) == "[]"
    assert encode(None) is None and encode({"a": 1}, store=False) is None
    assert encode("x" * (MAX_BYTES - 2)) is not None          # exactly the limit with its quotes
    assert encode("a\\u0000b") == '"a\\\\u0000b"'             # an escaped backslash, not NUL


@pytest.mark.parametrize("value, message", [
    ("x" * (MAX_BYTES - 1), "is 1,048,577 bytes of JSON, over the limit of 1,048,576"),
    ({"r": float("nan")}, "not JSON-serialisable: Out of range float values are not JSON compliant"),
    ({"o": object()}, "not JSON-serialisable: Object of type object is not JSON serializable"),
    ({1, 2}, "not JSON-serialisable"),
    ({"s": ["a\x00b"]}, "holds a NUL character"),
])
def test_encode_refuses_what_cannot_be_stored(value, message):
    with pytest.raises(ResultRejected, match=message):
        encode(value)


# -- in every mode --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_results_are_stored_in_every_mode(conn, supervisors, mode):
    conn.execute("CREATE SCHEMA results")
    conn.execute("CREATE TABLE results.effects (job_id bigint, attempt int, PRIMARY KEY (job_id, attempt))")
    options, prefixes = MODES[mode]
    ids = {(p, name): conn.execute("SELECT pgfence.enqueue(%s, %s::jsonb, p_max_attempts => 3)",
                                   (f"{p}_{name}", f'{{"n": "{p}-{name}"}}')).fetchone()[0]
           for p in prefixes for name in NAMES}
    sup = supervisors("a", **options)
    wait_for(lambda: conn.execute("SELECT count(*) FROM pgfence.job_history").fetchone()[0] == len(ids),
             timeout=30, message="every job finished")
    # A job its own fenced block completed gets its result a moment after it is done (one update after
    # the handler returned), and the warning of an unstorable one follows that block too.
    fenced = [ids[p, "fenced"] for p in prefixes]
    wait_for(lambda: conn.execute("SELECT count(*) FROM pgfence.job_history WHERE id = ANY(%s) AND result IS NOT NULL",
                                  (fenced,)).fetchone()[0] == len(fenced), timeout=30, message="the fenced results")
    wait_for(lambda: sup.log().count("is done, but its result was not stored") == len(prefixes), timeout=30,
             message="the warnings of the unstorable results")
    for p in prefixes:
        got = {name: get_job(conn, ids[p, name]) for name in NAMES}
        job_id = ids[p, "value"]
        assert {name: (j.status, j.attempt) for name, j in got.items()} == {
            "value": ("done", 1), "fenced": ("done", 1), "none": ("done", 1), "off": ("done", 1),
            "big": ("failed", 1), "nan": ("failed", 1), "fenced_unstorable": ("done", 1)}, (p, got)
        assert {name: j.result for name, j in got.items()} == {
            "value": {"id": job_id, "attempt": 1, "echo": {"n": f"{p}-value"}}, "fenced": {"fenced": 1},
            "none": None, "off": None, "big": None, "nan": None, "fenced_unstorable": None}
        assert got["big"].last_error == (f"result rejected: the handler's result is {MAX_BYTES + 2:,} bytes of "
                                         f"JSON, over the limit of {MAX_BYTES:,} (pgfence.results.MAX_BYTES)")
        assert got["nan"].last_error.startswith("result rejected: the handler's result is not JSON-serialisable")
    # The fenced kinds' writes committed with their completions, once each.
    assert sorted(conn.execute("SELECT job_id, attempt FROM results.effects")) == sorted(
        (ids[p, name], 1) for p in prefixes for name in ("fenced", "fenced_unstorable"))
    # The result of a job its own block completed, that could not be stored, is logged.
    assert sup.log().count("is done, but its result was not stored") == len(prefixes)
    assert sup.stop() == 0
