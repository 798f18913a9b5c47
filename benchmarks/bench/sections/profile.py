"""Section profile: py-spy on one authsvc worker under wrk."""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from benchmarks.bench.serve import (
    Server,
    check_answers,
    core_gunicorn_args,
    gunicorn,
    port_open,
    wait_for,
)
from benchmarks.bench.world import APPS, VENV_BIN, World
from harness.processes import free_port


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """py-spy samples one authsvc worker under wrk load: where a request's time goes, in situ."""
    py_spy = VENV_BIN / "py-spy"
    if not py_spy.exists():
        raise SystemExit(
            "bench: the profile section needs py-spy (pip install -r benchmarks/requirements.txt)"
        )
    port = free_port()
    raw = world.root / "profile.txt"
    with gunicorn(
        world,
        APPS["authsvc"],
        logs / "profile.log",
        bind=f"127.0.0.1:{port}",
        args=core_gunicorn_args(args.workers),
    ) as proc:
        wait_for(lambda: port_open(port), "gunicorn (profile)", proc)
        server = Server("authsvc", "endpoint", f"http://127.0.0.1:{port}", master=proc)
        check_answers(server, world)
        worker = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
        load = subprocess.Popen(
            [
                "wrk",
                f"-t{args.threads}",
                f"-c{args.connections}",
                f"-d{args.duration}s",
                "-s",
                str(script),
                server.url + "/",
            ],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(1)
        spy = subprocess.run(
            [
                str(py_spy),
                "record",
                "-p",
                worker,
                "-d",
                str(max(args.duration - 2, 1)),
                "-r",
                "400",
                "-f",
                "raw",
                "-o",
                str(raw),
                "--nonblocking",
            ],
            capture_output=True,
            text=True,
        )
        load.wait(args.duration + 60)
        if spy.returncode != 0 or not raw.exists():
            raise SystemExit(f"bench: py-spy failed: {spy.stderr.strip()[-500:]}")
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = {
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")"
            for f in stack.split(";")
            if " (" in f
        }
        total += int(count)
        for frame in frames:
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    print(
        f"\n5. Profile: py-spy, one of {args.workers} sync workers under wrk -c{args.connections}, "
        f"{total} samples (time in the worker, on or off the CPU, idle waits excluded); share of "
        "samples that include each function\n"
    )
    print("| function (file) | share |")
    print("|---|---|")
    # Leave out the frames every sample has (gunicorn's start-up and worker loop).
    mine = [
        (n, f)
        for f, n in inclusive.items()
        if ("authsvc/" in f or "gunicorn/" in f) and n < 0.9 * total
    ]
    for n, frame in sorted(mine, reverse=True)[: args.profile_rows]:
        print(f"| {frame} | {100 * n / total:.1f}% |")
