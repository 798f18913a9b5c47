"""Section capacity: CPU time per authentication of every process that serves it (docs/scaling.md's
figures).

On a shared machine req/s says more about the neighbours than about authsvc; the
CPU time a process spent, read from /proc before and after each wrk run and
divided by the authentications served, is steadier (not immune: BENCHMARKS.md
section 8), and each row's ratio to the same run's SQLite workers steadier still.
One throwaway PostgreSQL primary (the world's players imported), a
``pg_basebackup -R`` hot standby of it and a pgbouncer in transaction mode
(harness/pgserver.py); gunicorn on SQLite, on the primary directly, through
pgbouncer, on the standby; the shipped nginx site in front of gunicorn.conf.py and
the shipped authsvc.toml (access_record = "edge": nginx's line the one record) on
SQLite, on the primary and through pgbouncer (the deployed paths). The per-core figures are upper
bounds: 1e6 / (CPU µs per authentication) is what one core would serve if it did
nothing else, with no idle time and none of the kernel's network work that
/proc does not charge to these processes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.bench.sections.nginx import nginx_in_front
from benchmarks.bench.serve import (
    API_HOST,
    LEGACY_HOST,
    Server,
    check_answers,
    core_gunicorn_args,
    gunicorn,
    port_open,
    wait_for,
    wrk,
)
from benchmarks.bench.world import APPS, REPO, SHIPPED_ENV, World
from harness.pgserver import (
    Heartbeat,
    ThrowawayPgbouncer,
    ThrowawayPostgres,
    ThrowawayStandby,
    find_bin_dir,
    find_pgbouncer,
)
from harness.processes import free_port, wait_for_port

# Login roles in authsvc_reader, set up as docs/stores.md sets up authsvc_web: one per gunicorn on
# the primary (direct, through pgbouncer, behind nginx), so pg_stat_activity tells their server
# connections apart.
WEB_ROLE, POOLED_ROLE, FRONTED_ROLE = (
    "authsvc_bench_web",
    "authsvc_bench_pooled",
    "authsvc_bench_fronted",
)
COMPONENTS = ("app", "postgres", "pgbouncer", "nginx")


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU time of a process and all its descendants, living or exited (and reaped), from /proc:
    each living thread's time on a CPU in ns (schedstat; /proc/PID/stat counts in 10 ms ticks, too
    coarse for a process that spends 50 µs per request in a short run), plus the reaped children's
    user + system ticks."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        seconds = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
        children = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            seconds += int((task / "schedstat").read_text().split()[0]) / 1e9
            children += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError, IndexError):
        return None
    for child in children:
        seconds += (
            tree_cpu_seconds(child) or 0.0
        )  # a child that exits meanwhile lands in cutime next read
    return seconds


@dataclasses.dataclass
class Config:
    """One way of serving authentications, and a meter per process kind that serves them besides the
    workers."""

    server: Server
    meters: dict[str, Callable[[], float | None]]
    connections: Callable[[], str] = lambda: (
        "-"
    )  # PostgreSQL server connections of the web role, after the runs
    auths: int = 0
    errors: int = 0
    rps: list[float] = dataclasses.field(default_factory=list)
    cpu_us: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    server_connections: str = "-"

    def us(self, component: str) -> float | None:
        figures = self.cpu_us.get(component)
        return statistics.median(figures) if figures else None


def measure_once(config: Config, script: Path, args: argparse.Namespace) -> None:
    before = {name: meter() for name, meter in config.meters.items()}
    run = wrk(config.server, script, args)
    after = {name: meter() for name, meter in config.meters.items()}
    requests = run.requests
    config.auths += requests
    config.errors += run.errors
    config.rps.append(run.rps)
    if run.worker_cpu_us is not None:
        config.cpu_us.setdefault("app", []).append(run.worker_cpu_us)
    for name in config.meters:
        if before[name] is not None and after[name] is not None and requests:
            config.cpu_us.setdefault(name, []).append((after[name] - before[name]) / requests * 1e6)


def web_connections(cluster: ThrowawayPostgres, role: str) -> Callable[[], str]:
    def count() -> str:
        import psycopg

        with psycopg.connect(cluster.url, autocommit=True) as conn:
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)
            ).fetchone()[0]
        return str(n)

    return count


def provision(world: World, primary: ThrowawayPostgres) -> int:
    """The world's players in database ``authsvc`` of the primary (authsvc export/init/import), the
    web roles; the players table's size in bytes, with its index."""
    import psycopg

    with psycopg.connect(primary.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE authsvc")
    owner_url = primary.url.rsplit("/", 1)[0] + "/authsvc"
    cli = [sys.executable, "-m", "authsvc.cli.command"]
    export = world.root / "capacity-export.jsonl"
    subprocess.run(
        [*cli, "export", str(export)],
        env={**os.environ, **world.env},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    pg_env = {**os.environ, **world.env, "AUTHSVC_STORE": owner_url}
    subprocess.run([*cli, "init"], env=pg_env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*cli, "import", str(export)], env=pg_env, check=True, stdout=subprocess.DEVNULL)
    export.unlink()
    with psycopg.connect(
        owner_url, autocommit=True
    ) as conn:  # docs/stores.md: set on the role for pgbouncer
        for role in (WEB_ROLE, POOLED_ROLE, FRONTED_ROLE):
            conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE authsvc_reader")
            conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
            conn.execute(f"ALTER ROLE {role} SET statement_timeout = '2s'")
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")  # the standby's base backup starts from here
        size = conn.execute("SELECT pg_total_relation_size('players')").fetchone()[0]
    return size


def heartbeat_age(cluster: ThrowawayPostgres) -> float:
    """Seconds since the primary's time in the heartbeat row the standby has replayed (inf: none
    yet)."""
    import psycopg

    with psycopg.connect(cluster.url.rsplit("/", 1)[0] + "/authsvc", autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - at) FROM authsvc_heartbeat"
        ).fetchone()
    return float("inf") if row is None else float(row[0])


def steady_cost(
    primary: ThrowawayPostgres, heartbeat: Heartbeat, seconds: float = 5
) -> tuple[float, float]:
    """Percent of a core the primary (the heartbeat's commits, WAL sent to the standby) and the
    heartbeat writer spend with no authentications at all: what a standby costs per second, not per
    authentication."""
    pid = heartbeat.process.pid if heartbeat.process else None
    before = tree_cpu_seconds(primary.postmaster_pid()), tree_cpu_seconds(pid)
    time.sleep(seconds)
    after = tree_cpu_seconds(primary.postmaster_pid()), tree_cpu_seconds(pid)
    primary_pct, writer_pct = (
        100 * ((b or 0.0) - (a or 0.0)) / seconds for a, b in zip(before, after, strict=True)
    )
    return primary_pct, writer_pct


def staleness_check_cost(
    standby: ThrowawayStandby, world: World, calls: int, rounds: int = 5
) -> tuple[float, float]:
    """The standby's CPU per credentials query with the freshness column (the heartbeat's age) and
    without it (medians of alternating rounds of ``calls`` prepared queries on one connection, as
    the web process sends them)."""
    import psycopg

    from authsvc.store.postgres.reader import CREDENTIALS_SQL_PQ, STANDBY_SQL_PQ
    from authsvc.tokens import api_key_digest

    digest = api_key_digest(world.api_key).encode("ascii")
    figures: dict[bytes, list[float]] = {b"plain": [], b"checked": []}
    with psycopg.connect(f"postgresql://{WEB_ROLE}@127.0.0.1:{standby.port}/authsvc") as conn:
        pgconn = conn.pgconn
        pgconn.prepare(b"plain", CREDENTIALS_SQL_PQ)
        pgconn.prepare(b"checked", STANDBY_SQL_PQ)
        for _ in range(rounds):
            for name in (b"plain", b"checked"):
                before = tree_cpu_seconds(standby.postmaster_pid())
                for k in range(calls):
                    params = [b"%d" % world.user_ids[k % len(world.user_ids)], digest]
                    if (
                        pgconn.exec_prepared(name, params).get_value(0, 5) is None
                    ):  # enabled: NULL for no such player
                        raise SystemExit(f"bench: the standby did not find player {params[0]!r}")
                after = tree_cpu_seconds(standby.postmaster_pid())
                if before is not None and after is not None:
                    figures[name].append((after - before) / calls * 1e6)
    return statistics.median(figures[b"checked"]), statistics.median(figures[b"plain"])


@dataclasses.dataclass
class Fronted:
    """The shipped nginx site in front of the shipped gunicorn.conf.py and authsvc.toml
    (access_record = "edge") on a unix socket."""

    root: Path
    https_port: int
    http_port: int
    nginx: subprocess.Popen
    gunicorn: subprocess.Popen

    def http(self, label: str) -> Server:
        return Server(
            label,
            "endpoint",
            f"http://127.0.0.1:{self.http_port}",
            host=LEGACY_HOST,
            master=self.gunicorn,
        )

    def https(self, label: str) -> Server:
        return Server(
            label,
            "endpoint",
            f"https://{API_HOST}:{self.https_port}",
            ca_file=str(self.root / "ca.pem"),
            master=self.gunicorn,
        )

    @property
    def meters(self) -> dict[str, Callable[[], float | None]]:
        return {"nginx": lambda: tree_cpu_seconds(self.nginx.pid)}


def behind_nginx(
    stack: contextlib.ExitStack, world: World, logs: Path, name: str, store_env: dict, workers: int
) -> Fronted:
    root = world.root / f"capacity-nginx-{name}"
    sock = root / "authsvc.sock"
    https_port, http_port, nginx_proc = stack.enter_context(nginx_in_front(world, root, sock))
    env = {
        "AUTHSVC_BIND": f"unix:{sock}",
        "AUTHSVC_WORKER_CLASS": "sync",
        "AUTHSVC_WORKERS": str(workers),
        "AUTHSVC_THREADS": "1",
        "STATE_DIRECTORY": str(root),
        **SHIPPED_ENV,
        **store_env,
    }
    proc = stack.enter_context(
        gunicorn(
            world,
            APPS["authsvc"],
            logs / f"capacity-nginx-{name}.log",
            bind=f"unix:{sock}",
            env=env,
            args=("--config", str(REPO / "deploy" / "gunicorn.conf.py")),
        )
    )
    wait_for(sock.exists, f"gunicorn behind nginx ({name})", proc)
    return Fronted(root, https_port, http_port, nginx_proc, proc)


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    bin_dir, pgbouncer_bin = find_bin_dir(), find_pgbouncer()
    if bin_dir is None or pgbouncer_bin is None:
        raise SystemExit(
            "bench: the capacity section needs the PostgreSQL server binaries (initdb, pg_ctl, "
            "pg_basebackup) and pgbouncer (Debian: apt-get install postgresql pgbouncer)"
        )
    wrk_args = argparse.Namespace(**{**vars(args), "duration": args.capacity_seconds})
    workers = args.workers
    configs: list[Config] = []
    with contextlib.ExitStack() as stack:
        primary = ThrowawayPostgres(bin_dir)
        stack.callback(primary.destroy)
        primary.start()
        players_bytes = provision(world, primary)
        heartbeat = Heartbeat(
            primary.url.rsplit("/", 1)[0] + "/authsvc", logs / "capacity-heartbeat.log"
        )
        heartbeat.start()  # the standby's proof of freshness (docs/stores.md, "Hot standby")
        stack.callback(heartbeat.stop)
        standby = ThrowawayStandby(primary)
        stack.callback(standby.destroy)
        standby.start()
        assert heartbeat.process is not None
        wait_for(
            lambda: heartbeat_age(standby) < 0.5,
            "authsvc heartbeat (its age on the standby)",
            heartbeat.process,
        )
        pool_size = max(1, workers // 2)
        bouncer = ThrowawayPgbouncer(
            pgbouncer_bin,
            POOLED_ROLE,
            primary.port,
            primary.user,
            dbname="authsvc",
            pool_size=pool_size,
            max_client_conn=100,
        )
        stack.callback(bouncer.destroy)
        wait_for_port(bouncer.port)

        def web_url(cluster: ThrowawayPostgres, role: str = WEB_ROLE) -> str:
            return f"postgresql://{role}@127.0.0.1:{cluster.port}/authsvc"

        direct = [
            ("SQLite", {}, {}, None),
            (
                "PostgreSQL, direct",
                {"AUTHSVC_STORE": web_url(primary)},
                {"postgres": lambda: tree_cpu_seconds(primary.postmaster_pid())},
                (primary, WEB_ROLE),
            ),
            (
                f"PostgreSQL, pgbouncer (transaction, pool {pool_size})",
                {"AUTHSVC_STORE": bouncer.url},
                {
                    "postgres": lambda: tree_cpu_seconds(primary.postmaster_pid()),
                    "pgbouncer": lambda: tree_cpu_seconds(bouncer.proc.pid),
                },
                (primary, POOLED_ROLE),
            ),
            (
                "PostgreSQL, hot standby, direct",
                {"AUTHSVC_STORE": web_url(standby)},
                {"postgres": lambda: tree_cpu_seconds(standby.postmaster_pid())},
                (standby, WEB_ROLE),
            ),
        ]
        for n, (label, store_env, meters, served_by) in enumerate(direct):
            port = free_port()
            proc = stack.enter_context(
                gunicorn(
                    world,
                    APPS["authsvc"],
                    logs / f"capacity-{n}.log",
                    bind=f"127.0.0.1:{port}",
                    args=core_gunicorn_args(workers),
                    env=store_env,
                )
            )
            wait_for(lambda port=port: port_open(port), f"gunicorn ({label})", proc)
            configs.append(
                Config(
                    Server(label, "endpoint", f"http://127.0.0.1:{port}", master=proc),
                    meters,
                    web_connections(*served_by) if served_by else lambda: "-",
                )
            )

        sqlite_nginx = behind_nginx(stack, world, logs, "sqlite", {}, workers)
        pg_nginx = behind_nginx(
            stack, world, logs, "pg", {"AUTHSVC_STORE": web_url(primary, FRONTED_ROLE)}, workers
        )
        pooled_nginx = behind_nginx(
            stack, world, logs, "pgbouncer", {"AUTHSVC_STORE": bouncer.url}, workers
        )
        configs += [
            Config(sqlite_nginx.http("SQLite, nginx (plain HTTP)"), sqlite_nginx.meters),
            Config(sqlite_nginx.https("SQLite, nginx (HTTPS, kept alive)"), sqlite_nginx.meters),
            Config(
                pg_nginx.https("PostgreSQL, direct, nginx (HTTPS, kept alive)"),
                {**pg_nginx.meters, "postgres": lambda: tree_cpu_seconds(primary.postmaster_pid())},
                web_connections(primary, FRONTED_ROLE),
            ),
            # The same pool as the pgbouncer row above (its role): the pool's server connections.
            Config(
                pooled_nginx.https(
                    f"PostgreSQL, pgbouncer (transaction, pool {pool_size}), nginx (HTTPS, kept "
                    "alive)"
                ),
                {
                    **pooled_nginx.meters,
                    "postgres": lambda: tree_cpu_seconds(primary.postmaster_pid()),
                    "pgbouncer": lambda: tree_cpu_seconds(bouncer.proc.pid),
                },
                web_connections(primary, POOLED_ROLE),
            ),
        ]

        for config in configs:
            check_answers(config.server, world)
        load_before = Path("/proc/loadavg").read_text().split()[0]
        for n in range(args.rounds):
            for config in configs:
                measure_once(config, script, wrk_args)
                print(
                    f"  round {n + 1}: {config.server.label:<40} {config.rps[-1]:9,.0f} req/s",
                    file=sys.stderr,
                )
        for config in configs:
            check_answers(config.server, world, sample=20)
            config.server_connections = config.connections()
        load_after = Path("/proc/loadavg").read_text().split()[0]
        calls = max(100, args.capacity_seconds * 1000)
        checked, plain = staleness_check_cost(standby, world, calls)
        primary_pct, writer_pct = steady_cost(primary, heartbeat)
    print_tables(configs, args, workers)
    print(
        f"\nThe staleness check alone, on the standby: its CPU per credentials query {checked:.1f} "
        f"µs with the check, {plain:.1f} µs without ({checked - plain:+.1f} µs; {calls:,} prepared "
        "queries on one connection in each of 5 alternating rounds, medians)."
    )
    print(
        f"With no authentications, for the standby: the primary spends {primary_pct:.2f} % of a "
        f"core (the heartbeat's commits, WAL sent), the heartbeat writer {writer_pct:.2f} % (5 s)."
    )
    print(
        f"The PostgreSQL players table of {world.players:,} players, with its index: "
        f"{players_bytes / 2**20:.1f} MiB ({players_bytes / world.players:.0f} bytes a player)."
    )
    print(
        f"\nThe machine's load average (1 min, {os.cpu_count()} CPUs) before and after the runs: "
        f"{load_before} and {load_after}."
    )


def cell(us: float | None) -> str:
    return "-" if us is None else f"{us:.0f}"


def print_tables(configs: list[Config], args: argparse.Namespace, workers: int) -> None:
    print(
        "\n9. Capacity per core: CPU time per authentication of each process that serves it, from "
        f"/proc ({workers} sync workers per gunicorn, wrk -t{args.threads} -c{args.connections} "
        f"-d{args.capacity_seconds}s, {args.rounds} alternating rounds; medians of the rounds)\n"
    )
    head = [
        "configuration",
        "authentications",
        "req/s (noisy)",
        "errors",
        "app workers µs/auth",
        "PostgreSQL µs/auth",
        "pgbouncer µs/auth",
        "nginx µs/auth",
        "total µs/auth",
        f"total vs {configs[0].server.label} workers",
        "auth/s per core",
        "PostgreSQL connections",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    reference = configs[0].us(
        "app"
    )  # the same run's SQLite workers: the ratio to it is steadier than µs
    for c in configs:
        figures = [c.us(name) for name in COMPONENTS]
        total = sum(f for f in figures if f is not None)
        print(
            "| "
            + " | ".join(
                [
                    c.server.label,
                    f"{c.auths:,}",
                    f"{statistics.median(c.rps):,.0f}",
                    str(c.errors),
                    *(cell(f) for f in figures),
                    cell(total),
                    f"{total / reference:.2f}" if reference else "-",
                    f"{1e6 / total:,.0f}" if total else "-",
                    c.server_connections,
                ]
            )
            + " |"
        )
    print(
        "\n   Per component: authentications per second one core would serve doing nothing else "
        "(1e6 / µs per authentication; an upper bound)\n"
    )
    print("| configuration | app workers | PostgreSQL | pgbouncer | nginx |")
    print("|---|---|---|---|---|")
    for c in configs:
        cells = [f"{1e6 / us:,.0f}" if us else "-" for us in (c.us(name) for name in COMPONENTS)]
        print("| " + " | ".join([c.server.label, *cells]) + " |")
