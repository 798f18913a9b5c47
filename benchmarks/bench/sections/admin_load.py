"""Section admin-load: authentications' latency, and the revocation promise, while the admin API
syncs players.

Per engine of ``--sync-engines`` (SQLite: the world's store; PostgreSQL: a temporary database
holding the same players), the game-facing service (gunicorn, ``--workers`` sync workers)
and two admin services (2 sync workers each), all on loopback TCP: one at normal priority and
one at the priority deploy/systemd/authsvc-admin.service gives it (its ``Nice=`` and
``IOScheduling*=``, applied with ``nice`` and ``ionice``; its ``CPUWeight=`` needs a cgroup of
its own and is not applied here). Each round runs three variants in a rotating order: wrk
alone; wrk while ``--sync-clients`` clients post ``POST /v1/players/batch`` of 1,000 new
players back to back through the normal-priority admin service; the same through the
low-priority one. In the middle of each wrk run a probe player is revoked through the admin
service of the variant (the low-priority one when alone) and the old token is tried on the
game-facing service until half a second after the revoke's ``effective_by``: when it is
first refused, and whether any authentication that started after ``effective_by`` accepted
it (docs/admin-api.md, "The revocation promise").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import re
import secrets
import shutil
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.bench.sections.admin_sync import BATCH, _token
from benchmarks.bench.sections.postgres import postgres_copy
from benchmarks.bench.serve import (
    Run,
    Server,
    check_answers,
    core_gunicorn_args,
    gunicorn,
    port_open,
    wait_for,
    workers_cpu_seconds,
    wrk,
)
from benchmarks.bench.world import APPS, PATH, REPO, World
from harness.processes import free_port

UNIT = REPO / "deploy" / "systemd" / "authsvc-admin.service"
VARIANTS = ("alone", "with the sync", "with the sync, admin at low priority")
IONICE_CLASS = {"realtime": "1", "best-effort": "2", "idle": "3"}
PROBE_FIRST_ID = 4_000_000_000  # the probe players: far from the world's and the syncs' ids


# The kernel's CPU weight of each nice value (kernel/sched/core.c, sched_prio_to_weight), 0 to 19.
NICE_WEIGHTS = (
    1024,
    820,
    655,
    526,
    423,
    335,
    272,
    215,
    172,
    137,
    110,
    87,
    70,
    56,
    45,
    36,
    29,
    23,
    18,
    15,
)


def _unit(unit: Path = UNIT) -> dict[str, str]:
    return dict(re.findall(r"^(\w+)=(.*)$", unit.read_text(), re.M))


def group_nice(unit: Path = UNIT) -> int | None:
    """The session nice whose weight is the unit's CPUWeight= against the default 100, when this
    kernel
    schedules sessions as groups (autogroup): a process's own nice then counts only inside its
    session,
    as a service's does inside its cgroup, and the group's weight is what CPUWeight= sets under
    systemd.
    None when the kernel does not group by session (then nice alone applies, as Nice= does)."""
    try:
        grouped = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        grouped = False
    if not grouped:
        return None
    want = 1024 * int(_unit(unit).get("CPUWeight", "100")) / 100
    return min(range(len(NICE_WEIGHTS)), key=lambda n: abs(NICE_WEIGHTS[n] - want))


def low_priority_prefix() -> tuple[str, ...]:
    """``nice`` and ``ionice`` with the shipped admin unit's Nice= and IOScheduling*= settings."""
    unit = _unit()
    prefix: tuple[str, ...] = ("nice", "-n", unit.get("Nice", "0"))
    if shutil.which("ionice") and unit.get("IOSchedulingClass") in IONICE_CLASS:
        prefix += (
            "ionice",
            "-c",
            IONICE_CLASS[unit["IOSchedulingClass"]],
            "-n",
            unit.get("IOSchedulingPriority", "4"),
        )
    return prefix


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _call(
    port: int, token: str, method: str, path: str, body: dict | None = None
) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(
            method,
            path,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _authenticates(web_port: int, query: str) -> bool:
    """Whether the game-facing service accepts the query (False: its documented 403 answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", web_port, timeout=30)
    try:
        conn.request("GET", f"{PATH}?{query}")
        answer = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    if answer.get("success") is True:
        return True
    if answer.get("error") == 403:
        return False
    raise SystemExit(f"bench: admin-load's probe got {answer!r}")


def _body(first: int) -> bytes:
    return (
        '{"players":['
        + ",".join(f'{{"user_id":{n},"username":"player{n}"}}' for n in range(first, first + BATCH))
        + "]}"
    ).encode()


def _sync_until(
    port: int, token: str, stop: threading.Event, first_id: int, clients: int
) -> tuple[int, list[str]]:
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
                conn.request("POST", "/v1/players/batch", body=_body(start), headers=headers)
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


def _revoke_and_watch(
    admin_port: int, web_port: int, token: str, user_id: int, world: World
) -> dict:
    """Revoke ``user_id`` (whose epoch-0 token the web service accepts) and try the old token until
    half a second after effective_by. Times in ms after the revoke's answer."""
    sent = time.time()
    status, revoked = _call(admin_port, token, "POST", f"/v1/players/{user_id}/revoke")
    answered = time.time()
    if status != 200:
        raise SystemExit(f"bench: admin-load's revoke answered {status} {revoked!r}")
    effective_by = datetime.datetime.fromisoformat(revoked["effective_by"]).timestamp()
    query = world.query(user_id)
    tries: list[tuple[float, bool]] = []
    while True:  # the last try starts at least 0.5 s after effective_by, however slow the machine
        started = time.time()
        tries.append((started, _authenticates(web_port, query)))
        if started >= effective_by + 0.5:
            break
    refused = [t for t, ok in tries if not ok]
    accepted = [t for t, ok in tries if ok]
    return {
        "answer_ms": (answered - sent) * 1000,
        "refused_ms": (refused[0] - answered) * 1000 if refused else float("inf"),
        "last_accepted_ms": (accepted[-1] - answered) * 1000 if accepted else None,
        "effective_ms": (effective_by - answered) * 1000,
        "held": not any(ok for t, ok in tries if t > effective_by),
        "tries": len(tries),
    }


def _probe_ready(admin_port: int, web_port: int, token: str, user_id: int, world: World) -> None:
    """A new player the web service accepts (epoch 0), to revoke during the run."""
    status, answer = _call(
        admin_port, token, "PUT", f"/v1/players/{user_id}", {"username": f"probe{user_id}"}
    )
    if status != 201:
        raise SystemExit(f"bench: admin-load's probe player: {status} {answer!r}")
    deadline = time.monotonic() + 10
    while not _authenticates(web_port, world.query(user_id)):
        if time.monotonic() > deadline:
            raise SystemExit("bench: admin-load's probe player never authenticated")
        time.sleep(0.05)


@contextlib.contextmanager
def _engine_store(engine: str, world: World, args: argparse.Namespace) -> Iterator[str]:
    """The world's players in a store of ``engine`` of their own (a copy of the world's SQLite file,
    or a
    temporary PostgreSQL database): the syncs' players never reach the world's store."""
    if engine == "sqlite":
        path = world.root / f"admin-load-{secrets.token_hex(4)}.db"
        source = sqlite3.connect(world.store_url.removeprefix("sqlite://"))
        with contextlib.closing(source), contextlib.closing(sqlite3.connect(path)) as copy:
            source.backup(copy)
        try:
            yield f"sqlite://{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
        return
    with postgres_copy(world, args.pg, "admin-load on postgresql") as url:
        yield url


def _measure(
    engine: str,
    world: World,
    args: argparse.Namespace,
    logs: Path,
    script: Path,
    prefix: tuple[str, ...],
) -> tuple[
    dict[str, list[Run]],
    dict[str, list[float]],
    dict[str, list[dict]],
    list[float],
    dict[str, list[float]],
    dict[str, list[float]],
]:
    """Rounds of the three variants on one engine: runs, players synced a second, probes, load
    averages,
    the CPU time per second of the run (in cores) of the admin service's workers and of this process
    (the sync's clients, the probe, the bookkeeping)."""
    runs: dict[str, list[Run]] = {v: [] for v in VARIANTS}
    admin_cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    client_cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    synced: dict[str, list[float]] = {v: [] for v in VARIANTS}
    probes: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    loads: list[float] = []
    with _engine_store(engine, world, args) as url, contextlib.ExitStack() as stack:
        store_env = {"AUTHSVC_STORE": url}
        sync_token, probe_token = (
            _token(url, world, "bench-load-sync"),
            _token(url, world, "bench-load-probe"),
        )  # a bucket each
        web_port, admin_port, low_port = free_port(), free_port(), free_port()
        web = stack.enter_context(
            gunicorn(
                world,
                APPS["authsvc"],
                logs / f"admin-load-{engine}-web.log",
                bind=f"127.0.0.1:{web_port}",
                args=core_gunicorn_args(args.workers),
                env=store_env,
            )
        )
        admin_args = ("--workers", "2", "--worker-class", "sync", "--log-level", "warning")
        admin = stack.enter_context(
            gunicorn(
                world,
                "authsvc.api.wsgi:application",
                logs / f"admin-load-{engine}-admin.log",
                bind=f"127.0.0.1:{admin_port}",
                args=admin_args,
                env=store_env,
            )
        )
        low = stack.enter_context(
            gunicorn(
                world,
                "authsvc.api.wsgi:application",
                logs / f"admin-load-{engine}-admin-low.log",
                bind=f"127.0.0.1:{low_port}",
                args=admin_args,
                env=store_env,
                prefix=prefix,
            )
        )
        if (
            nice := group_nice()
        ) is not None:  # gunicorn runs in a session of its own (new_session)
            Path(f"/proc/{low.pid}/autogroup").write_text(f"{nice}\n")
        for port, proc, what in (
            (web_port, web, "game-facing"),
            (admin_port, admin, "admin"),
            (low_port, low, "admin, low priority"),
        ):
            wait_for(lambda port=port: port_open(port), f"gunicorn ({what})", proc)
        server = Server("authsvc", "endpoint", f"http://127.0.0.1:{web_port}", master=web)
        check_answers(server, world)
        next_id, probe_id = world.players + 1, PROBE_FIRST_ID
        for n in range(args.rounds):
            loads.append(_load())
            for variant in VARIANTS[n % 3 :] + VARIANTS[: n % 3]:
                port, master = (
                    (admin_port, admin) if variant == "with the sync" else (low_port, low)
                )
                probe_id += 1
                _probe_ready(port, web_port, probe_token, probe_id, world)
                stop, result, measured = threading.Event(), [], []
                syncer = threading.Thread(
                    target=lambda first=next_id, stop=stop, result=result, port=port: result.append(
                        _sync_until(port, sync_token, stop, first, args.sync_clients)
                    )
                )
                loader = threading.Thread(
                    target=lambda measured=measured: measured.append(wrk(server, script, args))
                )
                cpu_before, own_before, wall_before = (
                    workers_cpu_seconds(master),
                    time.process_time(),
                    time.monotonic(),
                )
                if variant != "alone":
                    syncer.start()
                try:
                    loader.start()
                    time.sleep(args.duration / 2)
                    probes[variant].append(
                        _revoke_and_watch(port, web_port, probe_token, probe_id, world)
                    )
                    loader.join()
                finally:
                    stop.set()
                    if variant != "alone":
                        syncer.join()
                cpu_after, own_after, wall_after = (
                    workers_cpu_seconds(master),
                    time.process_time(),
                    time.monotonic(),
                )
                if cpu_before is not None and cpu_after is not None:
                    admin_cpu[variant].append((cpu_after - cpu_before) / (wall_after - wall_before))
                client_cpu[variant].append((own_after - own_before) / (wall_after - wall_before))
                if not measured:
                    raise SystemExit("bench: admin-load's wrk run failed (see above)")
                runs[variant].append(measured[0])
                if variant != "alone":
                    written, failures = result[0]
                    if failures:
                        raise SystemExit(
                            f"bench: admin-load's sync got a wrong answer: {failures[0]}"
                        )
                    synced[variant].append(written / args.duration)
                    next_id += 10_000_000
                probe = probes[variant][-1]
                rate = synced[variant][-1] if variant != "alone" else 0
                print(
                    f"  {engine} round {n + 1}, {variant}: p99 {runs[variant][-1].p99_ms:.2f} ms, "
                    f"{rate:,.0f} players/s, revoke refused after {probe['refused_ms']:.0f} ms "
                    f"(effective_by {probe['effective_ms']:.0f}), load {_load():.1f}",
                    file=sys.stderr,
                )
        loads.append(_load())
        check_answers(server, world, sample=20)
    return runs, synced, probes, loads, admin_cpu, client_cpu


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    engines = [e.strip() for e in args.sync_engines.split(",") if e.strip()]
    prefix = low_priority_prefix()
    results = {engine: _measure(engine, world, args, logs, script, prefix) for engine in engines}
    print(
        f"\n## 12. Authentication under admin load ({world.players:,} players, "
        f"{' and '.join(engines)})\n"
    )
    print(
        f"wrk -t{args.threads} -c{args.connections} -d{args.duration}s on the game-facing service "
        f"({args.workers} sync workers) alone, then while {args.sync_clients} client(s) sync new "
        "players through POST /v1/players/batch (1,000 a call) into the same store, through an "
        f"admin service (2 sync workers) at normal priority, then at the unit's ({' '.join(prefix)}"
        f"{'' if group_nice() is None else f', its session at nice {group_nice()} for CPUWeight='}"
        f"); {args.rounds} rounds, the variants in a rotating order; medians. In each run a player "
        "is revoked mid-run and its old token tried until 0.5 s after effective_by (times after "
        "the revoke's answer).\n"
    )
    print(
        "| engine, run | auth req/s | p50 ms | p99 ms | errors | players synced/s | p99 vs alone "
        "| p99 vs alone, paired | admin CPU, cores | clients' CPU, cores | revoke answered ms "
        "| old token first refused ms | effective_by ms | promise held |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for engine, (runs, synced, probes, _, admin_cpu, client_cpu) in results.items():
        base = statistics.median(r.p99_ms for r in runs["alone"])
        for variant in VARIANTS:
            rs, ps = runs[variant], probes[variant]
            p99 = statistics.median(r.p99_ms for r in rs)
            paired = statistics.median(
                r.p99_ms / a.p99_ms for r, a in zip(rs, runs["alone"], strict=True)
            )
            rate = f"{statistics.median(synced[variant]):,.0f}" if synced[variant] else "-"
            refused = statistics.median(p["refused_ms"] for p in ps)
            held = sum(p["held"] for p in ps)
            admin_cpu_median = (
                statistics.median(admin_cpu[variant]) if admin_cpu[variant] else float("nan")
            )
            print(
                f"| {engine}, {variant} | {statistics.median(r.rps for r in rs):,.0f} | "
                f"{statistics.median(r.p50_ms for r in rs):.2f} | {p99:.2f} | "
                f"{sum(r.errors for r in rs)} | {rate} | {p99 / base:.2f} | {paired:.2f} | "
                f"{admin_cpu_median:.2f} | {statistics.median(client_cpu[variant]):.2f} | "
                f"{statistics.median(p['answer_ms'] for p in ps):.0f} | {refused:.0f} (max "
                f"{max(p['refused_ms'] for p in ps):.0f}) | "
                f"{statistics.median(p['effective_ms'] for p in ps):.0f} | "
                f"{'yes' if held == len(ps) else 'NO'} ({held} of {len(ps)}) |"
            )
    print("\nEvery round (p99 ms; the load average of the machine at the round's start):\n")
    print(
        "| engine | round | load | "
        + " | ".join(VARIANTS)
        + " | sync vs alone | low priority vs alone |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for engine, (runs, _, _, loads, _, _) in results.items():
        for n in range(args.rounds):
            alone, sync, low = (runs[v][n].p99_ms for v in VARIANTS)
            print(
                f"| {engine} | {n + 1} | {loads[n]:.1f} | {alone:.2f} | {sync:.2f} | {low:.2f} | "
                f"{sync / alone:.2f} | {low / alone:.2f} |"
            )
