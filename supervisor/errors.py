"""The one exception hierarchy of pgfence.

Driver errors are translated into these in one place, ``supervisor.db``; the
CLI prints any :class:`PgfenceError` as one line and exits non-zero.
"""


class PgfenceError(Exception):
    """Base of every error pgfence raises on purpose."""

    #: The process exit status the CLI uses for this error.
    exit_code = 1


class ConfigError(PgfenceError):
    """A setting, an argument or a payload the user gave is invalid."""

    exit_code = 2


class UnknownHandler(ConfigError):
    """No handler is registered for a job kind."""


class HandlerImportError(ConfigError):
    """A handler module named with ``--handlers`` could not be imported."""


class DatabaseError(PgfenceError):
    """The database refused or aborted a statement; ``sqlstate`` is the
    server's error code (None when the error did not come from the server).
    The message carries the server's own text."""

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached, or the connection broke (SQLSTATE
    class 08, a server shut down or restarting, a session ended by a
    timeout, a network error)."""


class TransactionConflict(DatabaseError):
    """The server aborted a statement to break a deadlock (40P01) or a
    serialization failure (40001): nothing was written, and the statement
    can be run again at once."""


class StatementCanceled(DatabaseError):
    """A statement ran past its ``statement_timeout`` or was canceled (57014)."""


class SchemaMissing(PgfenceError):
    """The pgfence schema is not there: run ``pgfence migrate`` first."""


class LeaseLost(PgfenceError):
    """This attempt no longer owns its job.

    Raised by :meth:`Job.check` once the lease is known to be gone, and by the
    fenced completion when the ``(id, attempt)`` fence matches no row; the
    handler's writes in that transaction are rolled back.
    """

    def __init__(self, job_id: int, attempt: int, reason: str):
        super().__init__(f"job {job_id} attempt {attempt}: lease lost ({reason})")
        self.job_id = job_id
        self.attempt = attempt
        self.reason = reason


class UnsafeStatement(PgfenceError):
    """A statement given to :meth:`Job.fenced_writes` cannot be sent safely
    in one message with the fenced completion (an unterminated quote or
    comment, several statements in one string, transaction control); nothing
    was sent."""


class NotCommitted(PgfenceError):
    """A block sent in one message came back without its completion
    committed (the connection still in a transaction, or a statement
    missing from the answers); it was rolled back."""


class PayloadRejected(PgfenceError):
    """A handler refuses a payload it cannot work with; the job fails at once,
    without retries."""


class RateLimited(PgfenceError):
    """Raised by a handler whose outside service refused it for now (an
    HTTP 429, its ``Retry-After``): the job goes back to the queue for
    ``retry_after`` seconds without spending an attempt, and a kind with a
    rate limit starts none of its jobs before then."""

    def __init__(self, retry_after: float, message: str = "rate limited"):
        if isinstance(retry_after, bool) or not isinstance(retry_after, int | float) or not 0 <= retry_after <= 86400:
            raise ConfigError(f"invalid retry_after: must be 0 to 86400 seconds, got {retry_after!r}")
        super().__init__(f"{message}: retry after {float(retry_after):g}s")
        self.retry_after = float(retry_after)


class ResultRejected(PgfenceError):
    """A handler's return value cannot be stored as its job's result (not
    JSON, over :data:`pgfence.results.MAX_BYTES`, or a string holding NUL):
    a job not yet completed fails at once, without retries, as its writes
    would be refused again."""
