-- complete_fenced: the fenced completion as one call that raises instead of
-- returning zero rows, so that a worker can send the handler's writes, the
-- completion and COMMIT in one round trip (psycopg pipeline mode, or one
-- simple-query message for Job.fenced_writes): when the attempt no longer
-- owns the job the error aborts the transaction, the server skips the COMMIT
-- queued behind it, and nothing of the block is kept.  SQLSTATE PF001 is
-- pgfence's own: "this attempt lost the job".
CREATE FUNCTION pgfence.complete_fenced(p_id bigint, p_attempt integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgfence.jobs
       SET status = 'done', finished_at = now(), locked_by = NULL, lease_until = NULL
     WHERE id = p_id AND attempt = p_attempt AND status = 'running';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgfence: job % attempt % no longer owns the job', p_id, p_attempt
            USING ERRCODE = 'PF001',
                  HINT = 'another attempt claimed it, or it was cancelled; its writes were rolled back';
    END IF;
END;
$$;
