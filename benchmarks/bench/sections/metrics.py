"""Section metrics: in-process cost per authentication with metrics on (multiprocess mode) against off."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from authsvc.app import App, make_app
from authsvc.settings import Settings
from benchmarks.bench.world import PerCall, World, environs, per_call_us


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """The same app with and without metrics (the metrics extra), alternating, as gunicorn.conf.py runs them."""
    try:
        from prometheus_client import values
    except ImportError:
        raise SystemExit("bench: the metrics extra is not installed (pip install -e '.[metrics]')") from None
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
        figures = {name: PerCall() for name in apps}
        for _ in range(3):  # alternate, like the wrk rounds
            for name, app in apps.items():
                figures[name].figures += per_call_us(app, envs, max(args.calls // 5, 1), 5,
                                                     lambda body: body.startswith(b'{"success":true,'))
        on.store.close()
    finally:
        values.ValueClass = value_class
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        shutil.rmtree(metrics_dir, ignore_errors=True)
    print(f"\n8. Metrics cost: in-process cost per call with and without metrics ({world.players:,} players, "
          "prometheus_client's multiprocess mode as under gunicorn.conf.py; 3 alternating rounds of 5 runs: "
          "best and median of the 15)\n")
    print("| app | µs per call, best | median |")
    print("|---|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {f.best:.2f} | {f.median:.2f} |")
    on_f, off_f = figures["authsvc, metrics on"], figures["authsvc, metrics off"]
    print(f"| difference | **+{on_f.best - off_f.best:.2f}** | +{on_f.median - off_f.median:.2f} |")
    print(f"\nTarget: metrics on within 3 µs of metrics off: +{on_f.best - off_f.best:.2f} µs best")
