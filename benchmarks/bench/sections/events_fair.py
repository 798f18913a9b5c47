"""Section events-fair: a healthy webhook's change-to-delivery beside a blackholed one (SQLite
store).

Two runs, each on a new store (section events' ``Run``): a receiver process on loopback subscribed
to every player event, and ``--events-fair-pending`` players created, then ``--events-changes``
renames written one by one, 50 a second; change (the event's time) to arrival, p50 and p99.

1. alone: the healthy webhook only;
2. beside a blackhole: a second webhook, subscribed to player.created, whose URL is a listener that
   accepts each connection and never answers, so each of its POSTs holds a thread for the timeout
   (AUTHSVC_WEBHOOK_TIMEOUT, 10 s) while its ``--events-fair-pending`` deliveries stay pending.

One ``authsvc deliver`` at its defaults (16 at once). The renames start once the healthy webhook
has taken its player.created events and the blackhole holds POSTs.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

from benchmarks.bench.sections.events import Run, _pct, until
from benchmarks.bench.world import World


class Blackhole:
    """A listener on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _latency(
    world: World, args: argparse.Namespace, logs: Path, blackholed: bool
) -> tuple[list[int], int]:
    """Change-to-delivery of the healthy webhook's renames (ms each), and the blackholed webhook's
    deliveries pending at the end (0 alone)."""
    from authsvc.operations import webhooks
    from authsvc.operations.context import command_context

    r = Run(world, logs, "fair-blackhole" if blackholed else "fair-alone")
    blackhole = Blackhole() if blackholed else None
    try:
        if blackhole is not None:
            r.env["AUTHSVC_WEBHOOK_ALLOW_HOSTS"] += f",127.0.0.1:{blackhole.port}"
            webhooks.add_webhook(
                r.store,
                command_context(),
                f"http://127.0.0.1:{blackhole.port}/hook",
                ["player.created"],
                None,
                r.env["AUTHSVC_WEBHOOK_ALLOW_HOSTS"],
            )
        with r.store.write() as tx:
            tx.import_players((i, f"p{i}") for i in range(1, args.events_fair_pending + 1))
        r.start_receiver()
        r.start_deliverer()
        if not until(lambda: r.delivered() >= args.events_fair_pending, 120):
            raise SystemExit(
                "bench events-fair: the healthy webhook did not take its player.created events"
            )
        if blackhole is not None and not until(lambda: len(blackhole.held) >= 1, 30):
            raise SystemExit("bench events-fair: the blackhole got no POST")
        time.sleep(0.5)  # the receiver's last lines written
        start = len(r.lines())
        for n in range(args.events_changes):
            with r.store.write() as tx:
                tx.rename_player(1 + n % args.events_fair_pending, f"renamed-{n}")
            time.sleep(0.02)
        until(lambda: len(r.lines()) >= start + args.events_changes, 120)
        time.sleep(0.5)
        latencies = [at - event for at, event in r.lines()[start:]]
        pending = 0
        if blackhole is not None:
            import sqlite3

            from authsvc.store.sqlite.url import path_from_url

            with sqlite3.connect(path_from_url(r.url)) as conn:
                pending = conn.execute(
                    "SELECT count(*) FROM deliveries WHERE state = 'pending'"
                ).fetchone()[0]
        return latencies, pending
    finally:
        if blackhole is not None:
            blackhole.close()
        r.close()


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    rows = []
    for blackholed in (False, True):
        latencies, pending = _latency(world, args, logs, blackholed)
        label = (
            f"beside a blackholed webhook ({pending:,} of its {args.events_fair_pending:,} still "
            "pending after)"
            if blackholed
            else "alone"
        )
        rows.append(
            (
                label,
                f"p50 {_pct(latencies, 0.5)} ms, p99 {_pct(latencies, 0.99)} ms, "
                f"max {max(latencies)} ms ({len(latencies)} events)",
            )
        )
    print("\n## Webhook delivery beside a blackholed receiver\n")
    print(
        f"One `authsvc deliver` (16 at once), SQLite store; {args.events_changes} renames at 50/s "
        "to a healthy receiver process on loopback; the machine's other load shares the CPUs.\n"
    )
    print("| the healthy webhook | change to delivery |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")
