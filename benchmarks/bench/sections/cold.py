"""Section cold: in-process cost with the CPU caches emptied before each call."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from authsvc.settings import Settings
from authsvc.web.app import make_app
from benchmarks.bench.world import World, environs


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """In-process cost with the CPU caches emptied before each call, as gunicorn's own work empties
    them."""
    from benchmarks import bare, flask_app, plain_app

    envs = environs(world)
    db_path = world.store_url.removeprefix("sqlite://")
    authsvc = make_app(Settings.from_env(world.env))
    apps = {
        "bare": bare.application,
        "plain": plain_app.create_app(db_path, world.secret),
        "authsvc": authsvc,
        "flask": flask_app.create_app(db_path, world.secret),
    }
    sizes = {
        "8 MB": 8 << 20,
        "64 MB": 64 << 20,
    }  # past this machine's L2 (1 MB/core); past its L3 (32 MB) too
    buffers = {label: bytearray(size) for label, size in sizes.items()}

    def start_response(status, headers, exc_info=None):
        return None

    print(
        "\n6. In-process cost per call: hot (called in a loop), and with 8 MB or 64 MB of memory "
        "touched before each call (as gunicorn's own work between two requests empties the "
        f"caches); {args.cold_calls} calls, best of 3 runs\n"
    )
    print("| app | hot µs | 8 MB touched µs | 64 MB touched µs |")
    print("|---|---|---|---|")
    for name, app in apps.items():
        for environ in envs[:50]:
            b"".join(app(dict(environ), start_response))
        figures: dict[str, list[float]] = {"hot": [], **{label: [] for label in sizes}}
        for _ in range(3):
            for label, runs in figures.items():
                junk = buffers.get(label)
                total = 0
                for k in range(args.cold_calls):
                    if junk is not None:
                        junk[::64] = bytes(len(junk) // 64)  # write every cache line
                    environ = dict(envs[k % len(envs)])
                    t0 = time.perf_counter_ns()
                    b"".join(app(environ, start_response))
                    total += time.perf_counter_ns() - t0
                runs.append(total / args.cold_calls / 1000)
        print("| " + " | ".join([name, *(f"{min(runs):.2f}" for runs in figures.values())]) + " |")
    authsvc.store.close()
