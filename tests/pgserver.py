"""Throwaway PostgreSQL servers for the tests: harness/pgserver.py, shared with scripts/bench."""

from harness.pgserver import (
    Heartbeat,
    ThrowawayPgbouncer,
    ThrowawayPostgres,
    ThrowawayStandby,
    find_bin_dir,
    find_pgbouncer,
)

__all__ = ["Heartbeat", "ThrowawayPgbouncer", "ThrowawayPostgres", "ThrowawayStandby", "find_bin_dir",
           "find_pgbouncer"]
