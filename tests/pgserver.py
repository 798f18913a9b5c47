"""Throwaway PostgreSQL servers for the tests: harness/pgserver.py, shared with scripts/bench."""

import contextlib
import time
from collections.abc import Iterator

from harness.pgserver import (
    Heartbeat,
    ThrowawayPgbouncer,
    ThrowawayPostgres,
    ThrowawayStandby,
    find_bin_dir,
    find_pgbouncer,
)

__all__ = [
    "Heartbeat",
    "ThrowawayPgbouncer",
    "ThrowawayPostgres",
    "ThrowawayStandby",
    "find_bin_dir",
    "find_pgbouncer",
    "primary_with_standby",
    "sql",
    "wait_replayed",
]


def sql(url: str, statement: str):
    """One statement on its own autocommit connection: its first row, or None."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchone() if cursor.description else None


def wait_replayed(primary, standby) -> None:
    """Until the standby has replayed every commit made on the primary so far. The test primary
    commits asynchronously: a commit of our own that writes WAL, with synchronous_commit on, writes
    out the WAL before it (one that writes none, as txid_current()'s, would not)."""
    import psycopg

    with psycopg.connect(primary.url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("SELECT pg_logical_emit_message(true, 'authsvc-test', '')")
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + 30
    while sql(standby.url, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'")[0] is not True:
        assert time.monotonic() < deadline, "the standby did not catch up in 30 s"
        time.sleep(0.05)


@contextlib.contextmanager
def primary_with_standby(
    *, migrate: bool = False
) -> Iterator[tuple[ThrowawayPostgres, ThrowawayStandby]]:
    """A throwaway primary and its ``pg_basebackup -R`` hot standby, both removed afterwards; the
    primary migrated first when asked, so the standby starts with the schema. Without PostgreSQL's
    binaries: skipped on a laptop, a failure under AUTHSVC_TEST_STRICT=1."""
    from authsvc.store import open_store
    from tests.support import skip_or_fail

    bin_dir = find_bin_dir()
    if bin_dir is None:
        skip_or_fail("PostgreSQL binaries (initdb, pg_ctl, pg_basebackup) not found")
    primary = ThrowawayPostgres(bin_dir)
    standby = None
    try:
        primary.start()
        if migrate:
            admin = open_store(primary.url, readonly=False)
            admin.migrate()
            admin.close()
        standby = ThrowawayStandby(primary)
        standby.start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
