"""Idempotency keys: one per job, never shared by two jobs; the opt-in
dedupe-key form is unambiguous too (review F13)."""

from __future__ import annotations

from pgfence.job import Job, dedupe_idempotency_key, idempotency_key
from pgfence.worker.lease import Lease


def job(job_id: int, kind: str, dedupe_key: str | None) -> Job:
    return Job(job_id, kind, "default", 1, {}, Lease(job_id, 1, 30.0), dedupe_key=dedupe_key)


def test_the_reviews_collisions_give_different_keys():
    # Job 42 without a dedupe key vs kind 'job' with dedupe key '42'.
    assert job(42, "send_receipt", None).idempotency_key == "pgfence:job:42"
    assert job(7, "job", "42").idempotency_key == "pgfence:job:7"
    assert job(7, "job", "42").dedupe_idempotency_key == "pgfence:dedupe:job:42"
    # Kinds and keys containing ':'.
    assert dedupe_idempotency_key("a:b", "c") == "pgfence:dedupe:a%3Ab:c"
    assert dedupe_idempotency_key("a", "b:c") == "pgfence:dedupe:a:b%3Ac"
    assert job(1, "a:b", "c").idempotency_key != job(2, "a", "b:c").idempotency_key
    # Two jobs of one kind with one dedupe key (the second enqueued after
    # the first finished): their own keys, one shared dedupe key.
    first, later = job(100, "daily_report", "user-9"), job(250, "daily_report", "user-9")
    assert (first.idempotency_key, later.idempotency_key) == ("pgfence:job:100", "pgfence:job:250")
    assert first.dedupe_idempotency_key == later.dedupe_idempotency_key == "pgfence:dedupe:daily_report:user-9"


def test_the_key_is_the_same_for_every_attempt_and_none_without_a_dedupe_key():
    attempts = [Job(5, "k", "q", attempt, {}, Lease(5, attempt, 30.0), dedupe_key="d") for attempt in (1, 2, 9)]
    assert {j.idempotency_key for j in attempts} == {idempotency_key(5)} == {"pgfence:job:5"}
    assert {j.dedupe_idempotency_key for j in attempts} == {"pgfence:dedupe:k:d"}
    assert job(5, "k", None).dedupe_idempotency_key is None


def test_dedupe_keys_are_injective_and_ascii():
    pairs = [("a", "b:c"), ("a:b", "c"), ("a%3Ab", "c"), ("a", "b%3Ac"), ("job", "42"), ("a", "b c"),
             ("a", "b+c"), ("café", "€"), ("a", ""), ("", "a"), ("a/b", "c"), ("a", "b/c")]
    keys = [dedupe_idempotency_key(kind, key) for kind, key in pairs]
    assert len(set(keys)) == len(pairs)
    assert all(k.isascii() and k.count(":") == 3 for k in keys)
    assert dedupe_idempotency_key("café", "€") == "pgfence:dedupe:caf%C3%A9:%E2%82%AC"
    assert not set(keys) & {idempotency_key(i) for i in range(100)}
