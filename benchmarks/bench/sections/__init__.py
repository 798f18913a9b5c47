"""The bench's sections, in the order a full run takes them: name -> what it measures and how to run
it.

Each section is a module with ``run(world, args, logs, script)``: the shared store
(``world``), the parsed options, a directory for server logs and the wrk request
script. ``--only NAME,...`` picks sections by the names of this table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from benchmarks.bench.sections import (
    admin_cost,
    admin_load,
    admin_sync,
    bodies,
    capacity,
    cold,
    core,
    events,
    events_cost,
    events_fair,
    gap,
    metrics,
    nginx,
    postgres,
    profile,
    scale,
    storm,
)


@dataclasses.dataclass(frozen=True)
class Section:
    run: Callable[..., None]
    description: str
    needs_wrk: bool  # sections that load a server with wrk; the others call the app in-process


SECTIONS: dict[str, Section] = {
    "core": Section(
        core.run,
        "bare app, authsvc (SQLite, 100,000 players) and Flask under identical gunicorn settings, "
        "wrk over loopback TCP; plus each app's in-process cost per call (the WSGI callable called "
        "directly, no server)",
        True,
    ),
    "nginx": Section(
        nginx.run,
        "the shipped nginx site (legacy plain-HTTP host, and the HTTPS host) in front of the "
        "shipped gunicorn.conf.py and authsvc.toml on a unix socket: sync against gthread workers, "
        "nginx keeping upstream connections alive",
        True,
    ),
    "gap": Section(
        gap.run,
        "instructions per request of one worker under callgrind (valgrind), behind the "
        "shipped nginx site and with section 1's flags: the bare app, authsvc, and rows that each "
        "change one thing (access_record = app's two lines, metrics, headers, the socket)",
        False,
    ),
    "postgres": Section(
        postgres.run,
        "authsvc on PostgreSQL (the same players, moved with authsvc export/import) "
        "against authsvc on SQLite, through gunicorn",
        True,
    ),
    "scale": Section(
        scale.run,
        "in-process cost per authentication with 100,000 against 10,000,000 players "
        "(SQLite); then, per engine and store size, the time of 'authsvc player import' and the "
        "per-call cost of the app and of store.credentials() alone (docs/stores.md)",
        False,
    ),
    "profile": Section(
        profile.run, "py-spy on one authsvc worker under wrk: where a request's time goes", True
    ),
    "cold": Section(
        cold.run,
        "in-process cost with the CPU caches emptied before each call, as in a worker "
        "between requests",
        False,
    ),
    "bodies": Section(
        bodies.run,
        "in-process cost of the costliest request bodies of at most 16 KiB "
        "(harness/hostile_bodies.py) against a plain form with the same three fields",
        False,
    ),
    "metrics": Section(
        metrics.run,
        "in-process cost per authentication with metrics on (the metrics extra, "
        "prometheus_client's multiprocess mode as under gunicorn.conf.py) against the same app "
        "with metrics off",
        False,
    ),
    "capacity": Section(
        capacity.run,
        "CPU time per authentication of every process serving it (gunicorn workers, PostgreSQL, "
        "pgbouncer, nginx), from /proc: SQLite; a throwaway PostgreSQL directly, through pgbouncer "
        "(transaction mode) and on a hot standby; SQLite behind the shipped nginx site; and the "
        "authentications per second per core they imply (docs/scaling.md)",
        True,
    ),
    "storm": Section(
        storm.run,
        "a login storm through the shipped nginx site, gunicorn.conf.py and authsvc.toml: the "
        "capacity (most req/s with a p99 under 20 ms), then many times that from "
        "--storm-connections clients, once per UPSTREAM_MAX_CONNS of --storm-max-conns (0: no "
        "limit), then normal load until the p99 is back under 20 ms",
        True,
    ),
    "admin-sync": Section(
        admin_sync.run,
        "an initial sync of --sync-players players (default 1,000,000) through the "
        "admin API's POST /v1/players/batch under real gunicorn, 1,000 a call, into an empty "
        "SQLite and PostgreSQL store: players per second",
        False,
    ),
    "admin-load": Section(
        admin_load.run,
        "authentications' p50 and p99 under wrk, alone against while the admin API syncs new "
        "players into the same store through its batch, at normal and at the shipped unit's low "
        "priority, on each engine of --sync-engines; and when a revoke issued mid-sync is first "
        "refused, against its effective_by",
        True,
    ),
    "admin-cost": Section(
        admin_cost.run,
        "another API token's GET p50 and p99, alone against while one token sends "
        "the costliest bodies it may (4 MiB dry-run batches), in --cost-rounds alternating rounds, "
        "under the admin service as shipped (2 gthread workers)",
        False,
    ),
    "events": Section(
        events.run,
        "one `authsvc deliver` against a receiver process on loopback (SQLite): sustained "
        "events per second, change-to-delivery p50 and p99, peak RSS with --events-pending events "
        "pending while the receiver is down, and the drain rate once it is back",
        False,
    ),
    "events-cost": Section(
        events_cost.run,
        "events on against off, same run: the admin sync of --events-cost-players "
        "into a store with no webhook against one with a webhook on every player event (players/s, "
        "each engine of --sync-engines); authentications' req/s under wrk alone against while "
        "`authsvc deliver` drains --events-cost-backlog events from the same SQLite store",
        True,
    ),
    "events-fair": Section(
        events_fair.run,
        "a healthy webhook's change-to-delivery p50 and p99 (--events-changes "
        "renames at 50/s) alone, and beside a blackholed webhook (a listener that never answers) "
        "with --events-fair-pending players pending (SQLite)",
        False,
    ),
}
