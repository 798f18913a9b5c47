"""Section admin-sync: an initial sync of N players through the admin API's batch, under real
gunicorn.

Per engine, an empty store (a new SQLite file; a temporary PostgreSQL database), the admin
service (``authsvc.api.wsgi:application``, 2 sync workers, loopback TCP, the default
rate limit) and ``--sync-clients`` clients posting ``POST /v1/players/batch`` of 1,000
players each, until the N players are in; then again into a new store with an
``Idempotency-Key`` on each call (the first answer kept, as a careful web tier sends it). The bodies
are encoded before the clock starts (the web tier's own cost is not ours); every answer is
checked (200, 1,000 created) and the store's count afterwards. A 429 is waited out as
its Retry-After says and counted.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.bench.sections.postgres import temporary_database
from benchmarks.bench.serve import gunicorn, port_open, wait_for
from benchmarks.bench.world import World
from harness.processes import free_port

BATCH = 1000
TARGETS = {
    "sqlite": 120.0,
    "postgresql": 180.0,
}  # seconds for 1,000,000 players (docs/admin-api.md)


@contextlib.contextmanager
def _store(engine: str, world: World, args: argparse.Namespace) -> Iterator[str]:
    """An empty, migrated store of ``engine``: its URL."""
    if engine == "sqlite":
        path = world.root / f"admin-sync-{secrets.token_hex(4)}.db"
        yield _migrated(f"sqlite://{path}", world)
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        return
    with temporary_database(args.pg, "admin-sync on postgresql") as url:
        yield _migrated(url, world)


def _migrated(url: str, world: World) -> str:
    from authsvc.settings import Settings
    from authsvc.store import open_store

    store = open_store(
        url, readonly=False, settings=Settings.from_env({**world.env, "AUTHSVC_STORE": url})
    )
    try:
        store.migrate()
    finally:
        store.close()
    return url


def _token(url: str, world: World, name: str = "bench-sync") -> str:
    from authsvc.operations import api_tokens
    from authsvc.operations.context import Context, admin_store
    from authsvc.settings import Settings

    with admin_store(Settings.from_env({**world.env, "AUTHSVC_STORE": url})) as store:
        _, token = api_tokens.add_api_token(
            store, Context(actor="cli:bench"), name, ["players:write"]
        )
    return token


def one_row(url: str, sql: str) -> tuple:
    """The one row ``sql`` answers, asked of the store's engine itself (the bench's own counts)."""
    if url.startswith("sqlite://"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite://"))) as conn:
            return tuple(conn.execute(sql).fetchone())
    import psycopg

    with psycopg.connect(url) as conn:
        return tuple(conn.execute(sql).fetchone())


def _count(url: str, world: World) -> int:
    """The players in the store, counted by the engine itself (the store has no count of its
    own)."""
    return one_row(url, "SELECT count(*) FROM players")[0]


def bodies(players: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "players": [
                    {"user_id": n, "username": f"player{n}", "enabled": True}
                    for n in range(start, min(start + BATCH, players + 1))
                ]
            }
        ).encode()
        for start in range(1, players + 1, BATCH)
    ]


def sync(
    port: int, token: str, payloads: list[bytes], clients: int, keyed: bool
) -> tuple[float, int]:
    """Post every payload from ``clients`` threads (``keyed``: each with its Idempotency-Key);
    (seconds, 429s). Stops the run on a wrong answer."""
    todo = iter(range(len(payloads)))
    lock = threading.Lock()
    limited = [0]
    failures: list[str] = []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while not failures:
                with lock:
                    k = next(todo, None)
                if k is None:
                    return
                while True:
                    key = {"Idempotency-Key": f"bench-sync-{k}"} if keyed else {}
                    conn.request(
                        "POST", "/v1/players/batch", body=payloads[k], headers=headers | key
                    )
                    response = conn.getresponse()
                    answer = response.read()
                    if response.status != 429:
                        break
                    with lock:
                        limited[0] += 1
                    time.sleep(int(response.getheader("Retry-After", "1")))
                expected = payloads[k].count(b'"user_id"')
                if response.status != 200 or json.loads(answer)["counts"]["created"] != expected:
                    failures.append(f"batch {k}: {response.status} {answer[:300]!r}")
        except OSError as e:
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    if failures:
        raise SystemExit(f"bench: admin-sync got a wrong answer: {failures[0]}")
    return seconds, limited[0]


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    engines = [e.strip() for e in args.sync_engines.split(",") if e.strip()]
    payloads = bodies(args.sync_players)
    rows = []
    for engine, keyed in ((engine, keyed) for engine in engines for keyed in (False, True)):
        with _store(engine, world, args) as url:
            token = _token(url, world)
            port = free_port()
            env = {"AUTHSVC_STORE": url}
            with gunicorn(
                world,
                "authsvc.api.wsgi:application",
                logs / f"admin-sync-{engine}.log",
                bind=f"127.0.0.1:{port}",
                args=("--workers", "2", "--worker-class", "sync", "--log-level", "warning"),
                env=env,
            ) as proc:
                wait_for(lambda port=port: port_open(port), f"the admin service ({engine})", proc)
                seconds, limited = sync(port, token, payloads, args.sync_clients, keyed)
            stored = _count(url, world)
        if stored != args.sync_players:
            raise SystemExit(
                f"bench: admin-sync stored {stored:,} players on {engine}, not "
                f"{args.sync_players:,}"
            )
        target = TARGETS.get(engine, 0) * args.sync_players / 1_000_000
        rows.append((engine + (", Idempotency-Key" if keyed else ""), seconds, limited, target))
    print(f"\n## 11. Admin API: batch sync of {args.sync_players:,} players\n")
    print(
        f"POST /v1/players/batch, {BATCH:,} players a call, into an empty store; the admin service "
        "under gunicorn (2 sync workers, loopback TCP, the default rate limit), "
        f"{args.sync_clients} client threads (a connection each; bodies encoded beforehand); each "
        "engine once without and once with an Idempotency-Key a call (its answer kept); "
        f"{os.cpu_count()} CPUs shared by everything.\n"
    )
    print("| engine | players | calls | seconds | players/s | 429s | target (s) |")
    print("|---|---|---|---|---|---|---|")
    for engine, seconds, limited, target in rows:
        print(
            f"| {engine} | {args.sync_players:,} | {len(payloads):,} | {seconds:.1f} | "
            f"{args.sync_players / seconds:,.0f} | {limited} | {target:.1f} "
            f"{'met' if seconds <= target else 'MISSED'} |"
        )
