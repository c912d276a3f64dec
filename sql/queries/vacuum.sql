-- name: vacuum_stats
-- One row about vacuum and pgfence.jobs, for the pgfence_jobs_* and
-- pgfence_xmin_horizon_* gauges, the warnings and pgfence's own VACUUM.
--
-- Dead and live row versions, vacuum counts and the last vacuum come from
-- pg_stat_user_tables, which every role may read.  With no vacuum recorded,
-- the age of the last one is counted from the later of the server's start
-- and the database's statistics reset: no vacuum happened since, as far as
-- anyone can know.  Autovacuum runs for the table when the server's
-- autovacuum and track_counts are on and the table's autovacuum_enabled
-- option is not false.
--
-- The xmin horizon: VACUUM cannot remove a row version that some snapshot
-- of this database may still see.  What holds it back, as far as this role
-- can see: a transaction of this database with an xid or a snapshot
-- (pg_stat_activity's backend_xid, backend_xmin; an ANALYZE's snapshot
-- counts, a VACUUM's does not), a prepared transaction of this database,
-- and a replication slot's xmin or a walsender's (any database).  Its age
-- is counted from the transaction's start, or from the PREPARE.  A role
-- that is neither a superuser nor a member of pg_read_all_stats sees the
-- backend_xmin of other roles' sessions but not their xact_start, and a
-- replication slot has no time at all: those holders come back in
-- untimed, each as a key that stays the same while the holder holds the
-- same xmin, and the caller ages them from when it first saw the key.
--
-- may_vacuum: whether this role may VACUUM the table: a superuser, a
-- member of the table's owner or of the database's owner, and from
-- PostgreSQL 17 a role with the MAINTAIN privilege (pg_maintain included).
-- Without it PostgreSQL skips the table with a WARNING and no error.
WITH holders AS (
    SELECT CASE WHEN a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL THEN a.xact_start END AS since,
           format('pid %s (%s)', a.pid, concat_ws(', ', coalesce(nullif(a.application_name, ''), a.backend_type),
                                                  coalesce(a.state, 'state hidden'))) AS what,
           format('backend:%s:%s', a.pid, coalesce(a.backend_xid, a.backend_xmin)) AS untimed_key
      FROM pg_stat_activity a
     WHERE (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
       AND a.pid <> pg_backend_pid()
       AND (a.datname = current_database() OR a.backend_type = 'walsender')
       AND coalesce(a.query, '') !~* '^\s*(autovacuum: )?vacuum'
    UNION ALL
    SELECT p.prepared, format('prepared transaction %s', p.gid), NULL
      FROM pg_prepared_xacts p
     WHERE p.database = current_database()
    UNION ALL
    SELECT NULL, format('replication slot %s', s.slot_name), format('slot:%s:%s', s.slot_name, s.xmin)
      FROM pg_replication_slots s
     WHERE s.xmin IS NOT NULL
), oldest AS (
    SELECT extract(epoch FROM now() - since)::float8 AS age, what
      FROM holders WHERE since IS NOT NULL
     ORDER BY since LIMIT 1
)
SELECT t.n_dead_tup AS dead_tuples,
       t.n_live_tup AS live_tuples,
       extract(epoch FROM now() - coalesce(greatest(t.last_vacuum, t.last_autovacuum),
                                           greatest(pg_postmaster_start_time(), d.stats_reset)))::float8
           AS since_vacuum,
       t.vacuum_count,
       t.autovacuum_count,
       current_setting('autovacuum')::boolean AND current_setting('track_counts')::boolean AS autovacuum_server,
       coalesce((SELECT option_value::boolean FROM pg_options_to_table(c.reloptions)
                  WHERE option_name = 'autovacuum_enabled'), true) AS autovacuum_table,
       coalesce((SELECT age FROM oldest), 0) AS horizon_age,
       (SELECT what FROM oldest) AS horizon_holder,
       ARRAY(SELECT h.untimed_key || ' ' || h.what FROM holders h
              WHERE h.since IS NULL AND h.untimed_key IS NOT NULL ORDER BY 1) AS untimed,
       (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
         OR pg_has_role(c.relowner, 'USAGE')
         OR pg_has_role(db.datdba, 'USAGE')
         OR CASE WHEN current_setting('server_version_num')::int >= 170000
                 THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS may_vacuum
  FROM pg_stat_user_tables t
  JOIN pg_class c ON c.oid = t.relid
  JOIN pg_database db ON db.datname = current_database()
  LEFT JOIN pg_stat_database d ON d.datid = db.oid
 WHERE t.relid = 'pgfence.jobs'::regclass;

-- name: vacuum_jobs
-- A plain VACUUM of pgfence.jobs (never FULL: that would lock out every
-- claim while it rewrites the table).  SKIP_LOCKED: should an autovacuum
-- or another supervisor's VACUUM be at work on the table, this one skips
-- it at once instead of queueing behind it (and cancelling the
-- autovacuum, which yields to a waiting lock).  Run outside a transaction
-- block, on an autocommit connection.
VACUUM (SKIP_LOCKED) pgfence.jobs;
