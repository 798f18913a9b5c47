"""Section core: bare app, authsvc and Flask under identical gunicorn settings; in-process cost per
call."""

from __future__ import annotations

import argparse
import contextlib
import statistics
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
from benchmarks.bench.world import APPS, World, in_process, print_in_process
from harness.processes import free_port


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    servers = []
    with contextlib.ExitStack() as stack:
        for name in APPS:
            port = free_port()
            proc = stack.enter_context(
                gunicorn(
                    world,
                    APPS[name],
                    logs / f"core-{name}.log",
                    bind=f"127.0.0.1:{port}",
                    args=core_gunicorn_args(args.workers),
                )
            )
            wait_for(lambda port=port: port_open(port), f"gunicorn ({name})", proc)
            kind = "bare" if name == "bare" else "endpoint"
            servers.append(Server(name, kind, f"http://127.0.0.1:{port}", master=proc))
        rows = measure(servers, world, script, args)
    bare, _, authsvc, flask = rows  # the plain app is compared in-process below
    print_table(
        f"1. Through gunicorn ({args.workers} sync workers, --preload, loopback TCP), wrk "
        f"-t{args.threads} -c{args.connections} -d{args.duration}s, {args.rounds} alternating "
        f"rounds, {world.players:,} players",
        rows,
        bare,
        {"flask": flask},
    )
    figures = in_process(world, args)
    print_in_process(figures, world)
    print(
        "\nTargets: authsvc/bare >= 0.95: {:.3f} | authsvc/Flask >= 1.5: {:.2f} | in-process <= 8 "
        "µs: {:.2f} ({:.2f} x plain; 8 µs was 0.44 x plain where the target was set) | p99 <= 10 "
        "ms: {:.2f}".format(
            authsvc.rps / bare.rps,
            authsvc.rps / flask.rps,
            figures["authsvc"].best,
            figures["authsvc"].best / figures["plain"].best,
            statistics.median(r.p99_ms for r in authsvc.runs),
        )
    )
