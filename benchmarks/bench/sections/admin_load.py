"""Section admin-load: authentications' latency while the admin API syncs players into the same store.

The game-facing service (gunicorn, ``--workers`` sync workers) and the admin service (2 sync
workers) on the world's SQLite store, both on loopback TCP. Rounds alternate: wrk alone, then
wrk while ``--sync-clients`` clients post ``POST /v1/players/batch`` of 1,000 new players
back to back for the whole wrk run. The table compares the authentications' p50 and p99. On
this machine the sync's CPU comes out of the same two cores, so the figure mixes the store
(SQLite readers keep their snapshots: a write never blocks them) with plain CPU contention.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import sys
import threading
from pathlib import Path

from benchmarks.bench.sections.admin_sync import BATCH, _token
from benchmarks.bench.serve import Server, check_answers, core_gunicorn_args, gunicorn, port_open, wait_for, wrk
from benchmarks.bench.world import APPS, World
from harness.processes import free_port


def _sync_until(port: int, token: str, stop: threading.Event, first_id: int, clients: int) -> tuple[int, list[str]]:
    """New players, 1,000 a call, until ``stop``: (players written, failures)."""
    lock = threading.Lock()
    state = {"next": first_id, "written": 0}
    failures: list[str] = []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while not stop.is_set() and not failures:
                with lock:
                    start = state["next"]
                    state["next"] += BATCH
                body = json.dumps({"players": [{"user_id": n, "username": f"player{n}"}
                                               for n in range(start, start + BATCH)]}).encode()
                conn.request("POST", "/v1/players/batch", body=body, headers=headers)
                response = conn.getresponse()
                answer = response.read()
                if response.status == 429:
                    stop.wait(int(response.getheader("Retry-After", "1")))
                    continue
                if response.status != 200 or json.loads(answer)["counts"]["created"] != BATCH:
                    failures.append(f"{response.status} {answer[:300]!r}")
                    return
                with lock:
                    state["written"] += BATCH
        except OSError as e:
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join()
    return state["written"], failures


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    token = _token(world.store_url, world)
    web_port, admin_port = free_port(), free_port()
    with contextlib.ExitStack() as stack:
        web = stack.enter_context(gunicorn(world, APPS["authsvc"], logs / "admin-load-web.log",
                                           bind=f"127.0.0.1:{web_port}", args=core_gunicorn_args(args.workers)))
        admin = stack.enter_context(gunicorn(world, "authsvc.admin.wsgi:application", logs / "admin-load-admin.log",
                                             bind=f"127.0.0.1:{admin_port}",
                                             args=("--workers", "2", "--worker-class", "sync", "--log-level",
                                                   "warning")))
        wait_for(lambda: port_open(web_port), "gunicorn (game-facing)", web)
        wait_for(lambda: port_open(admin_port), "gunicorn (admin)", admin)
        server = Server("authsvc", "endpoint", f"http://127.0.0.1:{web_port}", master=web)
        check_answers(server, world)
        alone, loaded, synced = [], [], []
        next_id = world.players + 1
        for n in range(args.rounds):
            alone.append(wrk(server, script, args))
            stop = threading.Event()
            result: list = []
            syncer = threading.Thread(target=lambda first=next_id, stop=stop, result=result: result.append(
                _sync_until(admin_port, token, stop, first, args.sync_clients)))
            syncer.start()
            try:
                loaded.append(wrk(server, script, args))
            finally:
                stop.set()
                syncer.join()
            written, failures = result[0]
            if failures:
                raise SystemExit(f"bench: admin-load's sync got a wrong answer: {failures[0]}")
            synced.append(written / args.duration)
            next_id += 10_000_000
            print(f"  round {n + 1}: alone p99 {alone[-1].p99_ms:.2f} ms, with the sync {loaded[-1].p99_ms:.2f} ms "
                  f"({written:,} players synced)", file=sys.stderr)
        check_answers(server, world, sample=20)
    print(f"\n## 12. Authentication under admin load ({world.players:,} players, SQLite)\n")
    print(f"wrk -t{args.threads} -c{args.connections} -d{args.duration}s on the game-facing service "
          f"({args.workers} sync workers) alone, then while {args.sync_clients} clients sync new players through "
          f"POST /v1/players/batch (1,000 a call, the admin service's 2 sync workers) into the same store; "
          f"{args.rounds} alternating rounds, medians.\n")
    print("| run | auth req/s | p50 ms | p99 ms | errors | players synced/s | p99 vs alone |")
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(r.p99_ms for r in alone)
    for label, runs, rate in (("alone", alone, "-"), ("with the sync", loaded, f"{statistics.median(synced):,.0f}")):
        p99 = statistics.median(r.p99_ms for r in runs)
        print(f"| {label} | {statistics.median(r.rps for r in runs):,.0f} | "
              f"{statistics.median(r.p50_ms for r in runs):.2f} | {p99:.2f} | {sum(r.errors for r in runs)} | "
              f"{rate} | {p99 / base:.2f} |")
