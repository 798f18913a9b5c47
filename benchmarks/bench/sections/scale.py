"""Section scale: in-process cost per authentication as the store grows.

Two tables. First, SQLite with 100,000 against ``--scale-players`` (10,000,000)
players, rounds alternating. Then, for each engine of ``--scale-engines`` and
size of ``--scale-sizes``: a fresh store (a temporary SQLite file, or a
temporary database on the ``--pg`` server, dropped afterwards), ``authsvc init``,
one game, ``authsvc player import`` of N players (timed, the real command in a
subprocess), then ``--auths`` authentications of random players through the
WSGI app in this process (parsing, one store query, HMAC, JSON), and the same
number of bare ``store.credentials()`` calls. The figures in docs/stores.md
come from this second table.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.app import make_app
from benchmarks.bench.world import SCALE_SAMPLE, PerCall, World, environs, make_world, per_call_us


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    t0 = time.monotonic()
    big = make_world(world.root / "scale", args.scale_players, seed=2)
    build_s = time.monotonic() - t0
    size_mb = os.path.getsize(big.store_url.removeprefix("sqlite://")) / 1e6
    figures = {"small": PerCall(), "big": PerCall()}
    apps, envs = {}, {}
    for name, w in (("small", world), ("big", big)):
        apps[name] = make_app(Settings.from_env(w.env))
        envs[name] = environs(w, sample=SCALE_SAMPLE)
    check = lambda body: body.startswith(b'{"success":true')  # noqa: E731
    for _ in range(3):
        for name in ("small", "big"):
            figures[name].figures += per_call_us(
                apps[name], envs[name], max(args.calls // 5, 1), 5, check
            )
    small, big_ = figures["small"], figures["big"]
    print(
        f"\n4. Scale: in-process cost per authentication, SQLite, {SCALE_SAMPLE:,} random players "
        f"cycled (the {args.scale_players:,}-player store: {size_mb:,.0f} MB, built in "
        f"{build_s:.0f} s); 3 alternating rounds of 5 runs\n"
    )
    print("| players | µs per call, best | median | best vs 100k | median vs 100k |")
    print("|---|---|---|---|---|")
    for name, w in (("small", world), ("big", big)):
        f = figures[name]
        print(
            f"| {w.players:,} | {f.best:.2f} | {f.median:.2f} | {f.best / small.best:.3f} | "
            f"{f.median / small.median:.3f} |"
        )
    print(
        f"\nTarget: {args.scale_players:,} within 1.2 x {world.players:,}: "
        f"{big_.best / small.best:.3f} (best), {big_.median / small.median:.3f} (median)"
    )
    for app in apps.values():
        app.store.close()
    engines = [e.strip() for e in args.scale_engines.split(",") if e.strip()]
    if engines:
        engine_table(
            engines,
            [int(n) for n in args.scale_sizes.split(",")],
            args.auths,
            args.pg,
            world.root / "engines",
        )


def timed_calls(func, args_list) -> list[float]:
    """Microseconds per call, one figure per call."""
    out = []
    clock = time.perf_counter_ns
    for call_args in args_list:
        t0 = clock()
        func(*call_args)
        out.append((clock() - t0) / 1000)
    return out


def summary(samples: list[float]) -> str:
    """mean, median and p99 in microseconds, as table cells."""
    samples = sorted(samples)
    p99 = samples[max(int(len(samples) * 0.99) - 1, 0)]
    return f"{statistics.fmean(samples):.1f} | {samples[len(samples) // 2]:.1f} | {p99:.1f}"


def engine_table(
    engines: list[str], sizes: list[int], n_auth: int, pg_url: str, workdir: Path
) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"\n4b. Import time and per-call cost by engine and store size: {n_auth:,} authentications "
        "of random players each, µs per call (mean, median, p99)\n"
    )
    print(
        "| engine | players | import s | app: mean | median | p99 | store.credentials: mean | "
        "median | p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for engine in engines:
        for players in sizes:
            print(engine_row(engine, players, n_auth, pg_url, workdir), flush=True)


def engine_row(engine: str, players: int, n_auth: int, pg_url: str, workdir: Path) -> str:
    """One row: a fresh store of ``players`` players on ``engine``, imported by the admin command,
    then timed."""
    secret_file = workdir / "token-secret"
    database = None
    if engine == "sqlite":
        url = f"sqlite://{workdir}/scale-{players}.db"
    elif engine == "postgresql":
        import psycopg

        database = f"authsvc_scale_{secrets.token_hex(4)}"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {database}")
        url = urllib.parse.urlunsplit(urllib.parse.urlsplit(pg_url)._replace(path="/" + database))
    else:
        raise SystemExit(
            f"bench: unknown engine {engine!r} in --scale-engines (sqlite, postgresql)"
        )
    env = {**os.environ, "AUTHSVC_STORE": url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
    env.pop("AUTHSVC_CONFIG", None)
    admin_command = [sys.executable, "-m", "authsvc.cli.command"]
    try:
        subprocess.run([*admin_command, "init"], env=env, check=True, stdout=subprocess.DEVNULL)
        csv_path = workdir / f"players-{players}.csv"
        if not csv_path.exists():
            csv_path.write_text(
                "user_id,username\n" + "".join(f"{i},player{i}\n" for i in range(1, players + 1))
            )
        t0 = time.monotonic()
        subprocess.run(
            [*admin_command, "player", "import", str(csv_path)],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        import_seconds = time.monotonic() - t0

        settings = Settings.from_env(
            {"AUTHSVC_STORE": url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
        )
        api_key = new_api_key()
        admin = open_store(url, readonly=False, settings=settings)
        with admin.write() as tx:
            game = tx.add_game("Scale", api_key_digest(api_key), int(time.time()))
        admin.close()

        rng = random.Random(players)
        user_ids = [rng.randint(1, players) for _ in range(n_auth)]
        secret = settings.token_secrets[0]
        environs_ = []
        for uid in user_ids:
            token = mint_token(secret, game.id, uid, 0)
            query = f"user_id={uid}&game_auth_token={token}&api_key={api_key}"
            environs_.append(
                {
                    "REQUEST_METHOD": "GET",
                    "PATH_INFO": "/api/authenticate.json",
                    "QUERY_STRING": query,
                    "wsgi.input": io.BytesIO(b""),
                }
            )
        app = make_app(settings)

        def start_response(status, headers):
            return None

        def call(environ):
            body = b"".join(app(dict(environ), start_response))
            if b'"success":true' not in body:
                raise SystemExit(f"bench: authentication failed on {engine}: {body!r}")

        timed_calls(
            call, [(e,) for e in environs_[:1000]]
        )  # warm-up: connection, prepared statement, caches
        app_us = timed_calls(call, [(e,) for e in environs_])
        digest = api_key_digest(api_key)
        store_us = timed_calls(app.store.credentials, [(digest, uid) for uid in user_ids])
        app.store.close()
        return (
            f"| {engine} | {players:,} | {import_seconds:.1f} | {summary(app_us)} | "
            f"{summary(store_us)} |"
        )
    finally:
        if database:
            import psycopg

            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
