"""scripts/bench's entry point: ``python -m benchmarks.bench [--only SECTION,...]``."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.bench.sections import SECTIONS
from benchmarks.bench.serve import write_wrk_script
from benchmarks.bench.world import SAMPLE, make_world


def versions() -> str:
    def out(cmd: list[str]) -> str:
        try:
            return (
                subprocess.run(cmd, capture_output=True, text=True, timeout=10)
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    import importlib.metadata

    import gunicorn as gunicorn_pkg

    wrk_version = out(["wrk", "-v"]).split(" [")[0]
    nginx_version = (
        subprocess.run(
            [shutil.which("nginx") or "/usr/sbin/nginx", "-v"], capture_output=True, text=True
        ).stderr.strip()
        if shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")
        else "nginx not installed"
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs "
        f"({cpu}); Python {platform.python_version()}, gunicorn {gunicorn_pkg.__version__}, SQLite "
        f"{sqlite3.sqlite_version}, Flask {importlib.metadata.version('flask')}, {wrk_version}, "
        f"{nginx_version}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description=(__package__ and sys.modules[__package__].__doc__ or "").split("\n\n")[0],
        epilog="sections:\n"
        + "\n".join(
            textwrap.fill(
                s.description, 100, initial_indent=f"  {name:<9} ", subsequent_indent=" " * 12
            )
            for name, s in SECTIONS.items()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections: {', '.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--players", type=int, default=100_000, help="players in the store (default 100,000)"
    )
    parser.add_argument(
        "--scale-players", type=int, default=10_000_000, help="players of the scale section's store"
    )
    parser.add_argument(
        "--scale-sizes",
        default="100000,1000000",
        help="store sizes of the scale section's per-engine table (default 100000,1000000)",
    )
    parser.add_argument(
        "--scale-engines",
        default="sqlite,postgresql",
        help="engines of the scale section's per-engine table ('' for none; postgresql uses --pg)",
    )
    parser.add_argument(
        "--auths",
        type=int,
        default=20_000,
        help="authentications per store in the scale section's per-engine table (default 20,000)",
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument(
        "--workers", type=int, default=2, help="gunicorn workers in core and postgres (default 2)"
    )
    parser.add_argument(
        "--calls", type=int, default=20_000, help="in-process calls per round (default 20,000)"
    )
    parser.add_argument(
        "--pg",
        default=os.environ.get(
            "AUTHSVC_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="superuser URL of a PostgreSQL server; a temporary database is made and dropped",
    )
    parser.add_argument(
        "--cold-calls", type=int, default=300, help="calls per run of the cold section"
    )
    parser.add_argument(
        "--profile-rows", type=int, default=30, help="functions listed by the profile section"
    )
    parser.add_argument(
        "--gap-warm",
        type=int,
        default=100,
        help="requests before the gap section counts (default 100)",
    )
    parser.add_argument(
        "--gap-requests",
        type=int,
        default=300,
        help="requests the gap section counts, per configuration (default 300)",
    )
    parser.add_argument(
        "--gap-rows",
        default="",
        help="gap section: only these rows: comma-separated numbers (from 1, as the table lists "
        "them) or texts found in their labels (default: every row)",
    )
    parser.add_argument(
        "--gap-rounds",
        type=int,
        default=1,
        help="gap section: measure the rows this many times (with --gap-against, this checkout and "
        "the other in turn) and report each row's median (default 1)",
    )
    parser.add_argument(
        "--gap-against",
        default="",
        metavar="CHECKOUT",
        help="gap section: also run these rows in another checkout of authsvc (e.g. `git worktree "
        "add /tmp/old COMMIT`), its own scripts/bench and deploy/ with this virtualenv, in the "
        "same run; a column of its figures and the ratio",
    )
    parser.add_argument(
        "--storm-connections", type=int, default=2000, help="storm section: clients (default 2,000)"
    )
    parser.add_argument(
        "--storm-seconds", type=int, default=30, help="storm section: storm length (default 30)"
    )
    parser.add_argument(
        "--storm-factor",
        default="4",
        help="storm section: offered load as a multiple of the capacity; comma-separated for one "
        "storm per factor on each --storm-max-conns value (default 4)",
    )
    parser.add_argument(
        "--storm-max-conns",
        default="shipped,0",
        help="storm section: the UPSTREAM_MAX_CONNS values to storm: numbers, 0 for no limit, "
        "'shipped' for the rendered default; N:W also sets AUTHSVC_MAX_QUEUE_WAIT=W "
        "(0: off; else its default); '' for none: the shed-cost table alone (default shipped,0)",
    )
    parser.add_argument(
        "--storm-capacity-seconds",
        type=int,
        default=4,
        help="storm section: seconds per run of the capacity search (default 4)",
    )
    parser.add_argument(
        "--storm-pin",
        choices=("auto", "off"),
        default="auto",
        help="storm section: 'auto' runs wrk on the first half of the CPUs and nginx and gunicorn "
        "on the rest (one each on two; unpinned, and said so, with one); 'off' shares them all "
        "(default auto)",
    )
    parser.add_argument(
        "--storm-shed-seconds",
        type=int,
        default=5,
        help="storm section: seconds per wrk run measuring nginx's CPU per shed 503, 0 to skip "
        "(default 5)",
    )
    parser.add_argument(
        "--storm-shed-rate",
        type=float,
        default=0,
        help="storm section: the shed-cost table's clients: 0 back to back (each client's next "
        "request as soon as its answer arrives), or paced clients offering this many req/s in "
        "all, as the storm's do (default 0)",
    )
    parser.add_argument(
        "--storm-nginx-policy",
        choices=("other", "batch"),
        default="other",
        help="storm section: the scheduling policy of the storm's nginx: 'other' (the default, as "
        "systemd starts it) or 'batch' (SCHED_BATCH: its wakeups never preempt the worker) "
        "(default other)",
    )
    parser.add_argument(
        "--storm-shed-variants",
        choices=("shipped", "all"),
        default="shipped",
        help="storm section: the sites of the shed-cost table: 'shipped' (the shipped site and the "
        "one logging every shed 503) or 'all' (also the candidates for a cheaper shed answer, "
        "none shipped) (default shipped)",
    )
    parser.add_argument(
        "--capacity-seconds",
        type=int,
        default=5,
        help="seconds per wrk run of the capacity section (default 5: CPU per request settles "
        "fast)",
    )
    parser.add_argument(
        "--sync-players",
        type=int,
        default=1_000_000,
        help="admin-sync section: players to sync (default 1,000,000)",
    )
    parser.add_argument(
        "--sync-engines",
        default="sqlite,postgresql",
        help="admin-sync and admin-load sections: engines (postgresql uses --pg) "
        "(default sqlite,postgresql)",
    )
    parser.add_argument(
        "--cost-rounds",
        type=int,
        default=20,
        help="admin-cost section: alternating rounds of 1.5 s alone and 1.5 s beside the costly "
        "token (default 20)",
    )
    parser.add_argument(
        "--sync-clients", type=int, default=4, help="admin-sync section: clients (default 4)"
    )
    parser.add_argument(
        "--events-burst", type=int, default=20_000, help="events section: pending events to deliver"
    )
    parser.add_argument(
        "--events-changes",
        type=int,
        default=500,
        help="events section: renames timed (default 500)",
    )
    parser.add_argument(
        "--events-pending",
        type=int,
        default=1_000_000,
        help="events section: events pending while the receiver is down (default 1,000,000)",
    )
    parser.add_argument(
        "--events-down", type=int, default=20, help="events section: seconds the receiver is down"
    )
    parser.add_argument(
        "--events-drain", type=int, default=30, help="events section: seconds of drain timed"
    )
    parser.add_argument(
        "--events-cost-players",
        type=int,
        default=100_000,
        help="events-cost section: players synced per run (default 100,000)",
    )
    parser.add_argument(
        "--events-cost-backlog",
        type=int,
        default=30_000,
        help="events-cost section: deliveries pending before each run beside the deliverer "
        "(default 30,000)",
    )
    parser.add_argument(
        "--events-fair-pending",
        type=int,
        default=1_000,
        help="events-fair section: players pending for the blackholed webhook (default 1,000)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (stores, logs)"
    )
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if any(SECTIONS[s].needs_wrk for s in sections) and not shutil.which("wrk"):
        raise SystemExit("bench: wrk is not installed (Debian/Ubuntu: apt-get install wrk)")

    root = Path(tempfile.mkdtemp(prefix="authsvc-bench-"))
    logs = root / "logs"
    logs.mkdir()
    try:
        print(f"# authsvc benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')}\n\n{versions()}\n")
        t0 = time.monotonic()
        world = make_world(root / "world", args.players)
        print(
            f"Store: SQLite, {args.players:,} players, built in {time.monotonic() - t0:.1f} s; "
            f"requests cycle through {SAMPLE} random players, all valid.",
            flush=True,
        )
        script = write_wrk_script(world, root / "requests.lua")
        for section in sections:
            print(f"bench: section {section} ...", file=sys.stderr, flush=True)
            SECTIONS[section].run(world, args, logs, script)
            sys.stdout.flush()
    finally:
        if args.keep:
            print(f"\n(work directory kept: {root})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
