"""Section events-cost: the admin sync and the game-facing path with events on, each against itself
without.

1. The admin sync (admin-sync's POST /v1/players/batch, 1,000 players a call, ``--sync-clients``
   clients) of ``--events-cost-players`` players into an empty store with no webhook, against one
   with a webhook subscribed to every player event, on each engine of ``--sync-engines``;
   ``--rounds`` rounds, the order alternating; players per second. Each sync writes an event per
   player either way; the deliveries are the deliverer's to write, so after each sync with the
   webhook its fan-out is run here, in process, at the deliverer's step size: deliveries per second.
2. The game-facing service (wrk, as section core, on a copy of the world's SQLite store) alone,
   against while ``authsvc deliver`` (at its unit's Nice= and CPUWeight=) drains
   ``--events-cost-backlog`` events
   from the same store to a receiver process on loopback; ``--rounds`` rounds, the order
   alternating; req/s. The receiver stands for a game's server, which runs elsewhere: it gets only
   what the machine's own work leaves (a session of its own at nice 19). The backlog is written
   before each such run, and must outlast it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.bench.sections import admin_sync
from benchmarks.bench.sections.admin_load import group_nice
from benchmarks.bench.sections.events import EVENTS, Run, lower, until
from benchmarks.bench.serve import (
    Server,
    check_answers,
    core_gunicorn_args,
    gunicorn,
    port_open,
    wait_for,
    wrk,
)
from benchmarks.bench.world import APPS, REPO, World
from harness.processes import free_port

DELIVER_UNIT = REPO / "deploy" / "systemd" / "authsvc-deliver.service"
RECEIVER_NICE = 19  # the receiver's session: what the machine's own work leaves


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _sync_once(
    engine: str,
    webhook: bool,
    world: World,
    args: argparse.Namespace,
    logs: Path,
    payloads: list[bytes],
) -> tuple[float, float | None]:
    """Players per second of one sync into a new store of ``engine`` (``webhook``: with one
    subscribed to all),
    and then (with the webhook) the fan-out's deliveries per second."""
    from authsvc.operations import webhooks
    from authsvc.operations.context import admin_store, command_context
    from authsvc.settings import Settings

    with admin_sync._store(engine, world, args) as url:
        token = admin_sync._token(url, world)
        if webhook:
            with admin_store(Settings.from_env({**world.env, "AUTHSVC_STORE": url})) as store:
                webhooks.add_webhook(
                    store, command_context(), "http://127.0.0.1:9/hook", EVENTS, None, "127.0.0.1:9"
                )
        port = free_port()
        with gunicorn(
            world,
            "authsvc.api.wsgi:application",
            logs / f"events-cost-sync-{engine}.log",
            bind=f"127.0.0.1:{port}",
            args=("--workers", "2", "--worker-class", "sync", "--log-level", "warning"),
            env={"AUTHSVC_STORE": url},
        ) as proc:
            wait_for(lambda: port_open(port), f"the admin service ({engine})", proc)
            seconds, _ = admin_sync.sync(port, token, payloads, args.sync_clients, keyed=False)
        if (stored := admin_sync._count(url, world)) != args.events_cost_players:
            raise SystemExit(f"bench: events-cost stored {stored:,} players on {engine}")
        if (found := _counts(url)) != (args.events_cost_players, 0):
            raise SystemExit(
                f"bench: events-cost: {found} (events, deliveries), not one event per player and "
                "none"
            )
        fan_out = _fan_out(url, world) if webhook else None
    return args.events_cost_players / seconds, fan_out


def _fan_out(url: str, world: World) -> float:
    """The deliverer's fan-out of the store's events, its step size at a time, in process:
    deliveries/s."""
    from authsvc.settings import Settings
    from authsvc.store import open_store
    from authsvc.webhooks.deliver import FAN_OUT

    store = open_store(
        url, readonly=False, settings=Settings.from_env({**world.env, "AUTHSVC_STORE": url})
    )
    try:
        written, more, t0 = 0, True, time.perf_counter()
        while more:
            step, more = store.fan_out_events(int(time.time() * 1000), FAN_OUT)
            written += step
        seconds = time.perf_counter() - t0
    finally:
        store.close()
    if _counts(url)[1] != written or not written:
        raise SystemExit(
            f"bench: events-cost: the fan-out wrote {written:,} deliveries, {_counts(url)[1]:,} "
            "are stored"
        )
    return written / seconds


def _counts(url: str) -> tuple[int, int]:
    """(events, deliveries) in the store."""
    return admin_sync.one_row(
        url, "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries)"
    )


def _nice() -> tuple[str, ...]:
    found = re.search(r"^Nice=(-?\d+)$", DELIVER_UNIT.read_text(), re.M)
    return ("nice", "-n", found.group(1)) if found and shutil.which("nice") else ()


def _auth_runs(world: World, args: argparse.Namespace, logs: Path, script: Path) -> dict[str, list]:
    """wrk alone and beside a draining deliverer, alternating: runs, delivered/s and backlog left
    per variant."""
    runs: dict[str, list] = {"alone": [], "deliver": [], "rates": [], "left": []}
    r = Run(world, logs, "cost", copy_of=world.store_url)
    try:
        r.start_receiver(group_nice=RECEIVER_NICE if group_nice(DELIVER_UNIT) is not None else None)
        port = free_port()
        with gunicorn(
            world,
            APPS["authsvc"],
            logs / "events-cost-web.log",
            bind=f"127.0.0.1:{port}",
            args=core_gunicorn_args(args.workers),
            env={"AUTHSVC_STORE": r.url},
        ) as web:
            wait_for(lambda: port_open(port), "gunicorn (authsvc)", web)
            server = Server("authsvc", "endpoint", f"http://127.0.0.1:{port}", master=web)
            check_answers(server, world)
            first = world.players + 1
            for n in range(args.rounds):
                for variant in ("alone", "deliver") if n % 2 == 0 else ("deliver", "alone"):
                    if variant == "alone":
                        runs["alone"].append(wrk(server, script, args))
                        continue
                    with r.store.write() as tx:
                        tx.import_players(
                            (i, f"e{i}") for i in range(first, first + args.events_cost_backlog)
                        )
                    first += args.events_cost_backlog
                    before = r.delivered()
                    r.start_deliverer(prefix=_nice(), session=group_nice(DELIVER_UNIT) is not None)
                    if not until(
                        lambda before=before: (
                            r.delivered() > before or r.deliverer.poll() is not None
                        ),
                        120,
                    ):
                        raise SystemExit(
                            "bench: events-cost: the deliverer delivered nothing in 120 s"
                        )
                    if (code := r.deliverer.poll()) is not None:
                        raise SystemExit(f"bench: events-cost: the deliverer exited with {code}")
                    lower(r.deliverer, group_nice(DELIVER_UNIT))  # its start counts in no figure
                    at, t0 = r.delivered(), time.monotonic()
                    runs["deliver"].append(wrk(server, script, args))
                    runs["rates"].append((r.delivered() - at) / (time.monotonic() - t0))
                    runs["left"].append(args.events_cost_backlog - (r.delivered() - before))
                    r.stop_deliverer()
                    print(
                        f"  round {n + 1}: {runs['deliver'][-1].rps:,.0f} req/s beside the "
                        f"deliverer ({runs['rates'][-1]:,.0f} deliveries/s, {runs['left'][-1]:,} "
                        "left)",
                        file=sys.stderr,
                    )
            check_answers(server, world, sample=20)
    finally:
        r.close()
    return runs


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    load_before = _load()
    engines = [e.strip() for e in args.sync_engines.split(",") if e.strip()]
    payloads = admin_sync.bodies(args.events_cost_players)
    syncs: dict[str, dict[bool, list[float]]] = {e: {False: [], True: []} for e in engines}
    fan_outs: dict[str, list[float]] = {e: [] for e in engines}
    for n in range(args.rounds):
        for engine in engines:
            for webhook in (False, True) if n % 2 == 0 else (True, False):
                rate, fan_out = _sync_once(engine, webhook, world, args, logs, payloads)
                syncs[engine][webhook].append(rate)
                if fan_out is not None:
                    fan_outs[engine].append(fan_out)
                print(
                    f"  round {n + 1}, {engine}, {'a webhook' if webhook else 'no webhook'}: "
                    f"{rate:,.0f} players/s"
                    + ("" if fan_out is None else f", then {fan_out:,.0f} deliveries/s fanned out"),
                    file=sys.stderr,
                )
    auth = _auth_runs(world, args, logs, script)
    print(
        f"\n## 15. Events on: the admin sync and the game-facing path (load average {load_before} "
        f"before, {_load()} after)\n"
    )
    session_nice = group_nice(DELIVER_UNIT)
    print(
        f"{args.rounds} rounds, the order alternating; medians. Sync: {args.events_cost_players:,} "
        f"players, POST /v1/players/batch (1,000 a call, {args.sync_clients} clients, admin "
        "service: 2 sync workers) into an empty store, with no webhook, then with one subscribed "
        "to every player event (an event per player either way; the deliveries are the "
        "deliverer's: its fan-out timed after the sync, in process). Authentication: wrk "
        f"-t{args.threads} -c{args.connections} -d{args.duration}s on the game-facing service "
        f"({args.workers} sync workers, {world.players:,} players, SQLite) alone, then while "
        f"`authsvc deliver` ({' '.join(_nice()) or 'nice 0'}"
        f"{'' if session_nice is None else f', its session at nice {session_nice} for CPUWeight='}"
        f", as its unit) drains a backlog of {args.events_cost_backlog:,} events from the same "
        "store to a receiver process on loopback (a game's server runs elsewhere: its session at "
        f"nice {RECEIVER_NICE}, given what the machine's own work leaves).\n"
    )
    print(
        "| measure | events off | events on | on / off | rounds (on / off) |\n|---|---|---|---|---|"
    )
    for engine in engines:
        off, on = syncs[engine][False], syncs[engine][True]
        print(
            f"| admin sync, {engine}: players/s | {statistics.median(off):,.0f} | "
            f"{statistics.median(on):,.0f} | "
            f"**{statistics.median(on) / statistics.median(off):.3f}** | "
            f"{' / '.join(f'{a / b:.2f}' for a, b in zip(on, off, strict=True))} |"
        )
    for engine in engines:
        print(
            f"| then the deliverer's fan-out, {engine}: deliveries/s | | "
            f"{statistics.median(fan_outs[engine]):,.0f} | | "
            f"{' / '.join(f'{r:,.0f}' for r in fan_outs[engine])} |"
        )
    alone, beside = auth["alone"], auth["deliver"]
    ratio = statistics.median(r.rps for r in beside) / statistics.median(r.rps for r in alone)
    print(
        f"| authentication req/s | {statistics.median(r.rps for r in alone):,.0f} | "
        f"{statistics.median(r.rps for r in beside):,.0f} | **{ratio:.3f}** | "
        f"{' / '.join(f'{a.rps / b.rps:.2f}' for a, b in zip(beside, alone, strict=True))} |"
    )
    p99_alone = statistics.median(r.p99_ms for r in alone)
    p99_beside = statistics.median(r.p99_ms for r in beside)
    print(
        f"| authentication p99 ms | {p99_alone:.2f} | {p99_beside:.2f} | "
        f"{p99_beside / p99_alone:.2f} | |"
    )
    print(
        f"| deliveries/s during the runs; backlog left at the end | | "
        f"{statistics.median(auth['rates']):,.0f}; {min(auth['left']):,} at least | | |"
    )
    if min(auth["left"]) <= 0:
        print("\nThe backlog ran out during a run: raise --events-cost-backlog.")
