"""Section metrics: in-process cost per authentication with metrics on (multiprocess mode) against
off."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from authsvc.settings import Settings
from authsvc.web.app import App, make_app
from benchmarks.bench.world import PerCall, World, environs, per_call_us


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """The same app with and without metrics (the metrics extra), alternating, as gunicorn.conf.py
    runs them."""
    try:
        from prometheus_client import values
    except ImportError:
        raise SystemExit(
            "bench: the metrics extra is not installed (pip install -e '.[metrics]')"
        ) from None
    envs = environs(world)
    settings = Settings.from_env(world.env)
    # prometheus_client's multiprocess mode (a value is an mmap write), as under
    # gunicorn.conf.py. It picks the mode when first imported, and an earlier section
    # may have imported it without the variable: pick it again now, and restore it after,
    # so that later sections neither share the directory nor pay for the mode.
    metrics_dir = tempfile.mkdtemp(prefix="bench-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    value_class = values.ValueClass
    values.ValueClass = values.get_value_class()
    try:
        on = make_app(settings)
        if on.metrics is None or on.metrics.multiprocess_dir != metrics_dir:
            raise SystemExit("bench: the metrics are not in multiprocess mode")
        off = App(settings, on.store)  # the same store, no metrics
        apps = {"authsvc, metrics off": off, "authsvc, metrics on": on}
        clocks = {"wall": time.perf_counter, "CPU": time.thread_time}
        figures = {(name, clock): PerCall() for clock in clocks for name in apps}
        for _ in range(3):  # alternate, like the wrk rounds
            for clock, clock_fn in clocks.items():
                for name, app in apps.items():
                    figures[name, clock].figures += per_call_us(
                        app,
                        envs,
                        max(args.calls // 5, 1),
                        5,
                        lambda body: body.startswith(b'{"success":true,'),
                        clock_fn,
                    )
        on.store.close()
    finally:
        values.ValueClass = value_class
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        shutil.rmtree(metrics_dir, ignore_errors=True)
    print(
        f"\n8. Metrics cost: in-process cost per call with and without metrics ({world.players:,} "
        "players, prometheus_client's multiprocess mode as under gunicorn.conf.py; 3 alternating "
        "rounds of 5 runs: best and median of the 15; wall time, and the thread's CPU time, which "
        "other processes on a busy machine disturb less)\n"
    )
    print("| app | µs per call, best | median | CPU µs per call, best | median |")
    print("|---|---|---|---|---|")
    for name in apps:
        wall, cpu = figures[name, "wall"], figures[name, "CPU"]
        print(
            f"| {name} | {wall.best:.2f} | {wall.median:.2f} | {cpu.best:.2f} | {cpu.median:.2f} |"
        )
    diffs = []
    for clock in clocks:
        on_f, off_f = figures["authsvc, metrics on", clock], figures["authsvc, metrics off", clock]
        diffs += [on_f.best - off_f.best, on_f.median - off_f.median]
    print(
        f"| difference | **{diffs[0]:+.2f}** | {diffs[1]:+.2f} | **{diffs[2]:+.2f}** | "
        f"{diffs[3]:+.2f} |"
    )
    off_cpu = figures["authsvc, metrics off", "CPU"].best
    print(
        f"\nTarget: metrics on within 3 µs of metrics off: {diffs[0]:+.2f} µs best (wall), "
        f"{diffs[2]:+.2f} µs best (CPU; {diffs[2] / off_cpu:+.0%} of metrics off)"
    )
