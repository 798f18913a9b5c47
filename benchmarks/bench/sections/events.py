"""Section events: one ``authsvc deliver`` process against a receiver on loopback (SQLite store).

The receiver is a process of its own (a threaded stdlib HTTP/1.1 server, keep-alive) that notes
each POST's arrival time and the event's ``timestamp``. Three runs, each on a new store with one
webhook subscribed to every player event:

1. throughput: ``--events-burst`` players imported (one player.created each, all pending) before
   the deliverer starts; events per second from its first delivery to its last;
2. latency: the deliverer idle, then ``--events-changes`` renames written one by one by the admin
   side, 50 a second; change (the event's time) to arrival at the receiver, p50 and p99;
3. backlog: ``--events-pending`` events pending while the receiver is down (every attempt refused),
   the deliverer's peak RSS (VmHWM) after ``--events-down`` seconds of that; then the receiver
   starts and the deliveries taken in the next ``--events-drain`` seconds give the drain rate.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from benchmarks.bench.world import World
from harness.processes import free_port

SECRET = "whsec_YmVuY2ggc2VjcmV0IGZvciBldmVudHM="
EVENTS = [
    "player.created",
    "player.deleted",
    "player.disabled",
    "player.enabled",
    "player.renamed",
    "player.revoked",
]


def receive(port: int, out: str) -> None:
    """The receiver process: one line per POST, ``arrival_ms<TAB>timestamp``; SIGTERM ends it."""
    lines: list[str] = []
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            at = int(time.time() * 1000)
            stamp = body.split(b'"timestamp":"', 1)[1].split(b'"', 1)[0].decode()
            with lock:
                lines.append(f"{at}\t{stamp}\n")
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True

    def flush() -> None:
        while True:
            time.sleep(0.2)
            with lock:
                taken, lines[:] = lines[:], []
            with open(out, "a") as f:
                f.writelines(taken)

    threading.Thread(target=flush, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        server.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    time.sleep(0.3)  # the last flush


class Run:
    """A store with one webhook (``copy_of``: a copy of that SQLite store), a receiver process and a
    deliverer
    process, stopped on exit."""

    def __init__(self, world: World, logs: Path, name: str, copy_of: str | None = None) -> None:
        import sqlite3

        from authsvc.settings import Settings
        from authsvc.store import open_store

        self.dir = world.root / f"events-{name}"
        self.dir.mkdir()
        self.url = f"sqlite://{self.dir}/authsvc.db"
        if copy_of is not None:
            source, copy = (
                sqlite3.connect(copy_of.removeprefix("sqlite://")),
                sqlite3.connect(f"{self.dir}/authsvc.db"),
            )
            with contextlib.closing(source), contextlib.closing(copy):
                source.backup(copy)
        self.env = {**os.environ, **world.env, "AUTHSVC_STORE": self.url}
        self.store = open_store(
            self.url, readonly=False, settings=Settings.from_env(self.env, require_secret=False)
        )
        self.store.migrate()
        self.port = free_port()
        self.env["AUTHSVC_WEBHOOK_ALLOW_HOSTS"] = f"127.0.0.1:{self.port}"
        self.arrivals = self.dir / "arrivals.tsv"
        self.arrivals.touch()
        self.logs, self.name = logs, name
        self.receiver: subprocess.Popen | None = None
        self.deliverer: subprocess.Popen | None = None
        from authsvc.operations import webhooks
        from authsvc.operations.context import command_context

        webhooks.add_webhook(
            self.store,
            command_context(),
            f"http://127.0.0.1:{self.port}/hook",
            EVENTS,
            None,
            self.env["AUTHSVC_WEBHOOK_ALLOW_HOSTS"],
        )

    def start_receiver(self, group_nice: int | None = None) -> None:
        """``group_nice``: in a session of its own at that nice (a stand-in for a server elsewhere,
        given only what the machine's own work leaves), set once it listens (``lower``)."""
        code = (
            f"from benchmarks.bench.sections.events import receive; receive({self.port}, "
            f"{str(self.arrivals)!r})"
        )
        self.receiver = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=Path(__file__).resolve().parents[3],
            start_new_session=group_nice is not None,
        )
        deadline = time.monotonic() + 60
        import socket

        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                lower(self.receiver, group_nice)
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("bench events: the receiver did not start")

    def start_deliverer(self, prefix: tuple[str, ...] = (), session: bool = False) -> None:
        """``prefix``: commands that exec it (``nice -n 10``); ``session``: in a session of its
        own, for ``lower`` once it delivers."""
        log = (self.logs / f"events-{self.name}-deliver.log").open("ab")
        self.deliverer = subprocess.Popen(
            [*prefix, sys.executable, "-m", "authsvc.cli.command", "deliver"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=session,
        )

    def stop_deliverer(self) -> None:
        """SIGTERM, and its outcomes written."""
        if self.deliverer is not None:
            self.deliverer.send_signal(signal.SIGTERM)
            self.deliverer.wait(60)
            self.deliverer = None

    def lines(self) -> list[tuple[int, int]]:
        """(arrival ms, event ms) of each POST so far."""
        found = []
        for line in self.arrivals.read_text().splitlines():
            at, stamp = line.split("\t")
            event = int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
            found.append((int(at), event))
        return found

    def delivered(self) -> int:
        import sqlite3

        from authsvc.store.sqlite.url import path_from_url

        with sqlite3.connect(path_from_url(self.url)) as conn:
            return conn.execute(
                "SELECT count(*) FROM deliveries WHERE state = 'delivered'"
            ).fetchone()[0]

    def close(self) -> None:
        for proc in (self.deliverer, self.receiver):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.store.close()


def lower(proc: subprocess.Popen, group_nice: int | None) -> None:
    """Put the session ``proc`` leads at ``group_nice`` (admin_load.group_nice: a unit's
    CPUWeight=), once it is ready: started at that weight beside busy sessions, Python's own start
    took over a minute (at nice 19 a session gets about 1.5 % of what one at nice 0 gets), and no
    figure counts the start."""
    if group_nice is not None:
        Path(f"/proc/{proc.pid}/autogroup").write_text(f"{group_nice}\n")


def until(predicate, seconds: float) -> bool:
    """Whether ``predicate`` came true within ``seconds`` (polled every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: list[int], q: float) -> int:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    rows: list[tuple[str, str]] = []
    # 1. throughput
    r = Run(world, logs, "burst")
    try:
        with r.store.write() as tx:
            tx.import_players((i, f"p{i}") for i in range(1, args.events_burst + 1))
        r.start_receiver()
        r.start_deliverer()
        done = until(lambda: r.delivered() >= args.events_burst, 600)
        arrivals = sorted(at for at, _ in r.lines())
        span = (arrivals[-1] - arrivals[0]) / 1000 if len(arrivals) > 1 else float("nan")
        rows.append(
            (
                f"sustained delivery, {args.events_burst:,} pending events, one per player",
                f"{len(arrivals) / span:,.0f} events/s"
                + ("" if done else " (not all delivered in 600 s)"),
            )
        )
    finally:
        r.close()
    # 2. latency
    r = Run(world, logs, "latency")
    try:
        with r.store.write() as tx:
            tx.import_players([(1, "p1")])
        r.start_receiver()
        r.start_deliverer()
        until(lambda: r.delivered() >= 1, 30)
        start = len(r.lines())
        for n in range(args.events_changes):
            with r.store.write() as tx:
                tx.rename_player(1, f"p1-{n}")
            time.sleep(0.02)
        until(lambda: r.delivered() >= 1 + args.events_changes, 60)
        time.sleep(0.5)
        latencies = [at - event for at, event in r.lines()[start:]]
        rows.append(
            (
                f"change to delivery, {args.events_changes} renames at 50/s, one player",
                f"p50 {_pct(latencies, 0.5)} ms, p99 {_pct(latencies, 0.99)} ms",
            )
        )
    finally:
        r.close()
    # 3. backlog
    r = Run(world, logs, "backlog")
    try:
        t0 = time.monotonic()
        with r.store.write() as tx:
            tx.import_players((i, f"p{i}") for i in range(1, args.events_pending + 1))
        made = time.monotonic() - t0
        r.start_deliverer()
        time.sleep(args.events_down)
        rss = _rss_peak_mb(r.deliverer.pid) if r.deliverer else float("nan")
        before = r.delivered()
        r.start_receiver()
        t1 = time.monotonic()
        time.sleep(args.events_drain)
        drained = r.delivered() - before
        rate = drained / (time.monotonic() - t1)
        rows.append(
            (
                f"{args.events_pending:,} pending (written in {made:.0f} s), receiver down for "
                f"{args.events_down} s: deliverer's peak RSS",
                f"{rss:.0f} MB",
            )
        )
        rows.append(
            (
                f"then the receiver back: deliveries in the next {args.events_drain} s",
                f"{rate:,.0f} events/s",
            )
        )
    finally:
        r.close()
    print("\n## 12. Webhook delivery\n")
    print(
        "One `authsvc deliver` (default settings: 16 at once), SQLite store, receiver process on "
        "loopback; the machine's other load shares the CPUs.\n"
    )
    print("| measure | result |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")
