"""Throwaway PostgreSQL servers for the tests: harness/pgserver.py, shared with scripts/bench."""

import contextlib
from collections.abc import Iterator

from harness.pgserver import (
    Heartbeat,
    ThrowawayPgbouncer,
    ThrowawayPostgres,
    ThrowawayStandby,
    find_bin_dir,
    find_pgbouncer,
)

__all__ = ["Heartbeat", "ThrowawayPgbouncer", "ThrowawayPostgres", "ThrowawayStandby", "find_bin_dir",
           "find_pgbouncer", "primary_with_standby"]


@contextlib.contextmanager
def primary_with_standby(*, migrate: bool = False) -> Iterator[tuple[ThrowawayPostgres, ThrowawayStandby]]:
    """A throwaway primary and its ``pg_basebackup -R`` hot standby, both removed afterwards; the primary
    migrated first when asked, so the standby starts with the schema. Without PostgreSQL's binaries:
    skipped on a laptop, a failure under AUTHSVC_TEST_STRICT=1."""
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
