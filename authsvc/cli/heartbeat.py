"""``authsvc heartbeat``: the primary's time, written a few times a second, for hot standbys to
prove freshness.

A web process reading from a hot standby answers only while the heartbeat the standby
has replayed is at most AUTHSVC_MAX_STALENESS old (docs/stores.md, "Hot standby"): WAL
is replayed in order, so a heartbeat written on the primary at time T shows that every
change committed there before T is replayed as well. The time is the primary server's
own ``now()``, not this host's clock, so where the writer runs does not matter; one
writer is enough and a second is harmless. It runs as a long-lived service
(deploy/systemd/authsvc-heartbeat.service) with settings of its own, as a role that
may write the heartbeat row and nothing else (deploy/postgres/heartbeat.toml), and
never gives up: a failed write is reported once, retried every interval, and its
end reported too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from authsvc.errors import CommandError, ConfigError, StoreUnavailable, StoreUnreachable
from authsvc.store import open_store, redact_url

DEFAULT_INTERVAL = (
    0.2  # seconds; well under AUTHSVC_MAX_STALENESS (1 s at most) with replication's delay
)
MIN_INTERVAL, MAX_INTERVAL = 0.05, 0.5


def add_arguments(parser) -> None:
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between two heartbeats, {MIN_INTERVAL:g} to {MAX_INTERVAL:g} (default "
        f"{DEFAULT_INTERVAL:g})",
    )


def _say(text: str) -> None:
    print(f"authsvc heartbeat: {text}", file=sys.stderr, flush=True)


def cmd_heartbeat(args, settings):
    if not MIN_INTERVAL <= args.interval <= MAX_INTERVAL:
        raise CommandError(f"--interval must be from {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds")
    store = open_store(settings.store, readonly=False, settings=settings)
    try:
        write, prepare = (
            getattr(store, "write_heartbeat", None),
            getattr(store, "heartbeat_connections", None),
        )
        if write is None or prepare is None:
            raise CommandError(
                "the heartbeat is for a PostgreSQL primary read through hot standbys "
                "(docs/stores.md)"
            )
        try:
            # not migrated, wrong role: stop here; a server that is down is waited for below
            store.check()
        except StoreUnreachable:
            pass
        prepare()
        _say(
            f"writing the primary's time into {redact_url(settings.store)} every {args.interval:g} "
            "s"
        )
        run(write, args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    return 0, {"stopped": True}, "stopped"


def run(write: Callable[[], None], interval: float) -> None:
    """Call ``write`` every ``interval`` seconds, for ever; say when it fails and when it works
    again."""
    failing_since: float | None = None
    reason = ""
    due = time.monotonic()
    while True:
        try:
            write()
            if failing_since is not None:
                _say(
                    f"writing again, after {time.monotonic() - failing_since:.1f} s without a "
                    "heartbeat"
                )
                failing_since, reason = None, ""
        except (StoreUnavailable, ConfigError) as e:
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            if failing_since is None:
                failing_since = time.monotonic()
            if text != reason:  # once per reason, not five lines a second
                reason = text
                _say(
                    f"cannot write: {text}; trying again every {interval:g} s (hot standbys answer "
                    "503 once their heartbeat is older than AUTHSVC_MAX_STALENESS)"
                )
        due += interval
        now = time.monotonic()
        if (
            due < now
        ):  # a slow write (or a suspended process): start afresh rather than write in a burst
            due = now
        time.sleep(due - now)
