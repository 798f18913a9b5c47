"""Section postgres: authsvc on PostgreSQL against authsvc on SQLite, through gunicorn."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from benchmarks.bench.serve import (
    Server,
    core_gunicorn_args,
    gunicorn,
    measure,
    port_open,
    print_table,
    wait_for,
)
from benchmarks.bench.world import APPS, World
from harness.processes import free_port


@contextlib.contextmanager
def temporary_database(url: str, what: str = "a PostgreSQL row") -> Iterator[str]:
    """A new, empty database on the server of ``url`` (--pg); its URL, dropped after (its sessions
    ended). ``what`` names the rows that need it when there is no server to reach."""
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as e:
        raise SystemExit(
            f"bench: {what} needs a PostgreSQL server (--pg): {type(e).__name__}"
        ) from None
    database = "authsvc_bench_" + secrets.token_hex(4)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    try:
        yield urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + database))
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


@contextlib.contextmanager
def postgres_copy(world: World, url: str, what: str = "a PostgreSQL row") -> Iterator[str]:
    """A temporary database (temporary_database) holding the world's store, copied with authsvc
    export/init/import; its URL, dropped after."""
    with temporary_database(url, what) as pg_url:
        cli = [sys.executable, "-m", "authsvc.cli.command"]
        export = world.root / "export.jsonl"
        export.unlink(missing_ok=True)
        subprocess.run(
            [*cli, "export", str(export)],
            env={**os.environ, **world.env},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        pg_env = {**os.environ, **world.env, "AUTHSVC_STORE": pg_url}
        subprocess.run([*cli, "init"], env=pg_env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(
            [*cli, "import", str(export)], env=pg_env, check=True, stdout=subprocess.DEVNULL
        )
        export.unlink()
        yield pg_url


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    with postgres_copy(world, args.pg) as pg_url:
        servers = []
        with contextlib.ExitStack() as stack:
            # The third row: PostgreSQL with the worker count docs/operations.md advises for it
            # (a worker waits for each round trip, so more workers than CPUs fill the gaps).
            pg_workers = 2 * (os.cpu_count() or 1) + 1
            for label, store_env, workers in (
                ("authsvc, SQLite", {}, args.workers),
                ("authsvc, PostgreSQL", {"AUTHSVC_STORE": pg_url}, args.workers),
                (
                    f"authsvc, PostgreSQL, {pg_workers} workers",
                    {"AUTHSVC_STORE": pg_url},
                    pg_workers,
                ),
            ):
                port = free_port()
                proc = stack.enter_context(
                    gunicorn(
                        world,
                        APPS["authsvc"],
                        logs / f"pg-{len(servers)}.log",
                        bind=f"127.0.0.1:{port}",
                        args=core_gunicorn_args(workers),
                        env=store_env,
                    )
                )
                wait_for(lambda port=port: port_open(port), f"gunicorn ({label})", proc)
                servers.append(Server(label, "endpoint", f"http://127.0.0.1:{port}", master=proc))
            rows = measure(servers, world, script, args)
    print_table(
        f"3. PostgreSQL against SQLite, the same {world.players:,} players, through gunicorn "
        f"({args.workers} sync workers unless the row says otherwise, loopback TCP; PostgreSQL on "
        "this machine)",
        rows,
        rows[0],
    )
