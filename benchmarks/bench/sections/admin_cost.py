"""Section admin-cost: what one API token's costliest bodies cost another token's calls
(docs/admin-api.md, "Rate limit").

The admin service as docs/admin-api.md runs it (the shipped gunicorn.conf.py and admin.toml: 2
gthread workers of 4 threads, the shipped rate limit) on a new SQLite store, on loopback TCP.
Another token sends ``GET /v1/players/7`` every 30 ms, each on a new connection; rounds alternate
between that token alone and that token while 4 threads of one players:write token send the
costliest dry-run batch the reader lets through (harness/hostile_bodies.py: 4 MiB, ~50 ms of a
worker's CPU), each as soon as the last is answered or its Retry-After has passed. Alternating short
rounds puts the machine's own noise into both columns alike; the figure is the ratio of the two p99s
(the target: at most 2).
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import threading
import time
from pathlib import Path

from benchmarks.bench.serve import gunicorn, port_open, wait_for
from benchmarks.bench.world import REPO, World
from harness.hostile_bodies import costliest_batch
from harness.processes import free_port

PHASE = 1.5  # seconds of each round's half
PAUSE = 1.5  # after a costly half: its last bodies answered, the token's bucket refilled


def _call(
    port: int,
    token: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict | None = None,
) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        conn.close()


def _service_env(world: World, root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The admin service's environment on a new store holding player 7, and the two tokens."""
    from authsvc.operations import api_tokens
    from authsvc.operations.context import Context
    from authsvc.settings import Settings
    from authsvc.store import open_store

    env = {
        **world.env,
        "AUTHSVC_CONFIG": str(REPO / "deploy" / "etc" / "admin.toml"),
        "AUTHSVC_STORE": "sqlite://" + str(root / "admin-cost.db"),
        "STATE_DIRECTORY": str(root),
    }
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    try:
        store.migrate()
        with store.write() as tx:
            tx.add_player(7, "patient")
        tokens = {
            name: api_tokens.add_api_token(
                store, Context(actor="cli:bench"), name, ["players:read", "players:write"]
            )[1]
            for name in ("cost", "other")
        }
    finally:
        store.close()
    return env, tokens


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    root = world.root / f"admin-cost-{os.getpid()}"
    root.mkdir(exist_ok=True)
    env, tokens = _service_env(world, root)
    port = free_port()
    body = costliest_batch()
    costly_on = threading.Event()
    stop = threading.Event()
    answers: list[int] = []
    samples: dict[str, list[float]] = {"alone": [], "during": []}
    statuses: list[int] = []

    def send_costly(n: int) -> None:
        sent = 0
        while not stop.is_set():
            if not costly_on.wait(0.1):
                continue
            sent += 1
            try:
                status, headers = _call(
                    port,
                    tokens["cost"],
                    "POST",
                    "/v1/players/batch",
                    body,
                    {"Idempotency-Key": f"cost-{n}-{sent}"},
                )
            except (
                OSError,
                http.client.HTTPException,
            ):  # refused before its body was all sent: cut off
                status, headers = 429, {"Retry-After": "1"}
            answers.append(status)
            if status == 429:
                stop.wait(int(headers.get("Retry-After", "1")))

    def gets(into: list[float]) -> None:
        end = time.monotonic() + PHASE
        while time.monotonic() < end:
            started = time.monotonic()
            status, _ = _call(port, tokens["other"], "GET", "/v1/players/7")
            into.append(time.monotonic() - started)
            statuses.append(status)
            time.sleep(0.03)

    conf = ("--config", str(REPO / "deploy" / "gunicorn.conf.py"), "--graceful-timeout", "5")
    with gunicorn(
        world,
        "authsvc.api.wsgi:application",
        logs / "admin-cost.log",
        bind=f"127.0.0.1:{port}",
        args=conf,
        env=env,
    ) as proc:
        wait_for(lambda: port_open(port), "the admin service", proc)
        senders = [threading.Thread(target=send_costly, args=(n,), daemon=True) for n in range(4)]
        for sender in senders:
            sender.start()
        try:
            for _ in range(args.cost_rounds):
                gets(samples["alone"])
                costly_on.set()
                time.sleep(0.3)  # the first bodies in flight
                gets(samples["during"])
                costly_on.clear()
                time.sleep(PAUSE)
        finally:
            stop.set()
            costly_on.set()
            for sender in senders:
                sender.join(60)
    if set(statuses) != {200}:
        raise SystemExit(
            f"bench: admin-cost: another token's GETs were answered {sorted(set(statuses))}"
        )
    figures = {
        name: (statistics.median(v) * 1000, _percentile(v, 0.99) * 1000, len(v))
        for name, v in samples.items()
    }
    alone, during = figures["alone"], figures["during"]
    print(
        f"\n## admin-cost: another token's GET while one token sends its costliest bodies "
        f"({args.cost_rounds} alternating rounds of {PHASE} s)\n"
    )
    print("| another token's GET | p50 ms | p99 ms | samples |")
    print("|---|---:|---:|---:|")
    for name, (p50, p99, n) in figures.items():
        print(f"| {name} | {p50:.2f} | {p99:.2f} | {n} |")
    print(f"| during / alone | {during[0] / alone[0]:.2f} | {during[1] / alone[1]:.2f} | |")
    counts = {status: answers.count(status) for status in sorted(set(answers))}
    print(f"\nthe costly token's answers: {counts}; target: p99 during / alone at most 2\n")
