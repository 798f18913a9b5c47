"""Servers under wrk: gunicorn (started by harness.processes), the checks before and after, wrk runs
and tables."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.bench.world import PATH, REPO, VENV_BIN, World, username
from harness.processes import start_gunicorn, stop

API_HOST, LEGACY_HOST = "localhost", "legacy.bench.test"  # the nginx section's two hosts


def wait_for(
    check: Callable[[], bool], what: str, proc: subprocess.Popen, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise SystemExit(
                f"bench: {what} exited with code {proc.returncode}; see {proc.args[0]}'s log above"
            )
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not ready after {timeout}s")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def unix_socket_open(path: Path) -> bool:
    """Whether gunicorn accepts on ``path``: the file appears at bind(), before listen()."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(0.5)
            s.connect(str(path))
        return True
    except OSError:
        return False


@dataclasses.dataclass
class Server:
    """One running server and how to reach it; ``label`` names it in the tables."""

    label: str
    # "bare" (its fixed body) or "endpoint" (the documented answers): what the checks expect
    kind: str
    url: str  # base URL wrk and the checks use
    host: str | None = None  # Host header to send (nginx virtual hosts)
    ca_file: str | None = None  # the CA that signed an HTTPS server's certificate
    master: subprocess.Popen | None = None  # gunicorn's master, to read its workers' CPU time


@contextlib.contextmanager
def gunicorn(
    world: World,
    app: str,
    log: Path,
    *,
    bind: str,
    args: tuple[str, ...] = (),
    env: dict | None = None,
    prefix: tuple[str, ...] = (),
) -> Iterator[subprocess.Popen]:
    """gunicorn serving ``app``; the same flags for every app unless ``args`` adds some; ``prefix``:
    commands that exec it (``nice -n 10``)."""
    proc = start_gunicorn(
        {**world.env, "PYTHONPATH": str(REPO), **(env or {})},
        *args,
        bind=bind,
        app=app,
        workers=None,
        gunicorn=VENV_BIN / "gunicorn",
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        new_session=True,
        prefix=prefix,
    )
    try:
        yield proc
    finally:
        stop(proc)


def core_gunicorn_args(workers: int) -> tuple[str, ...]:
    return (
        "--workers",
        str(workers),
        "--worker-class",
        "sync",
        "--preload",
        "--log-level",
        "warning",
    )


def fetch(server: Server, query: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{server.url}{PATH}?{query}", headers={"Host": server.host} if server.host else {}
    )
    context = ssl.create_default_context(cafile=server.ca_file) if server.ca_file else None
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return response.status, response.read()


def check_answers(server: Server, world: World, sample: int = 3) -> None:
    """The valid, 403 and 400 cases answer as documented (bare: its fixed body), or the run
    stops."""
    from benchmarks.bare import BODY

    def expect(query: str, want: dict | bytes) -> None:
        try:
            status, body = fetch(server, query)
        except OSError as e:
            raise SystemExit(f"bench: {server.label} did not answer: {e}") from None
        got = body if isinstance(want, bytes) else json.loads(body)
        if status != 200 or got != want:
            raise SystemExit(
                f"bench: {server.label} answered {status} {body[:200]!r}, expected {want!r}"
            )

    uid = world.user_ids[0]
    if server.kind == "bare":
        expect(world.query(uid), BODY)
        return
    for uid in world.user_ids[:sample]:
        expect(world.query(uid), {"success": True, "user_id": uid, "username": username(uid)})
    expect(
        world.query(uid, game_auth_token="0" * 64),
        {"success": False, "error": 403, "error_description": "Invalid credentials"},
    )
    expect(
        world.query(uid, api_key=None),
        {
            "success": False,
            "error": 400,
            "error_description": "user_id, game_auth_token, and api_key are required parameters",
        },
    )


WRK_SCRIPT = """-- written by benchmarks/bench (scripts/bench):
-- cycle through valid requests of many players
local paths = {%(paths)s}
local requests, n, i = {}, 0, 0
function init(args)
  for k, p in ipairs(paths) do requests[k] = wrk.format("GET", p) end
  n = #requests
  i = math.random(n) - 1
end
function request()
  i = i %% n + 1
  return requests[i]
end
function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format('WRK_RESULT {"requests":%%d,"duration_us":%%d,' ..
    '"p50_us":%%d,"p99_us":%%d,' ..
    '"connect":%%d,"read":%%d,"write":%%d,"status":%%d,"timeout":%%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


@dataclasses.dataclass
class Run:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    worker_cpu_us: float | None  # CPU time of the gunicorn workers per request (user + system)
    requests: int = 0  # answered in the run


def write_wrk_script(world: World, path: Path) -> Path:
    path.write_text(WRK_SCRIPT % {"paths": ",\n".join(json.dumps(p) for p in world.paths())})
    return path


def workers_cpu_seconds(master: subprocess.Popen | None) -> float | None:
    """User + system CPU time so far of the gunicorn master's children (its workers), from /proc."""
    if master is None:
        return None
    try:
        children = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
        ticks = 0
        for pid in children:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def wrk(server: Server, script: Path, args: argparse.Namespace) -> Run:
    cpu_before = workers_cpu_seconds(server.master)
    command = [
        "wrk",
        f"-t{args.threads}",
        f"-c{args.connections}",
        f"-d{args.duration}s",
        "--timeout",
        "5s",
        "-s",
        str(script),
    ]
    if server.host:
        command += ["-H", f"Host: {server.host}"]
    done = subprocess.run(
        [*command, server.url + "/"], capture_output=True, text=True, timeout=args.duration + 60
    )
    match = re.search(r"^WRK_RESULT (\{.*\})$", done.stdout, re.M)
    if done.returncode != 0 or not match:
        raise SystemExit(
            f"bench: wrk failed on {server.label}: {done.stderr.strip() or done.stdout[-500:]}"
        )
    cpu_after = workers_cpu_seconds(server.master)
    r = json.loads(match.group(1))
    errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    cpu_us = (
        None
        if cpu_before is None or cpu_after is None
        else (cpu_after - cpu_before) / r["requests"] * 1e6
    )
    return Run(
        r["requests"] / (r["duration_us"] / 1e6),
        r["p50_us"] / 1000,
        r["p99_us"] / 1000,
        errors,
        cpu_us,
        r["requests"],
    )


@dataclasses.dataclass
class Row:
    server: Server
    runs: list[Run] = dataclasses.field(default_factory=list)

    @property
    def rps(self) -> float:
        return statistics.median(r.rps for r in self.runs)

    def cells(self) -> list[str]:
        return [
            f"{self.rps:,.0f}",
            f"{statistics.median(r.p50_ms for r in self.runs):.2f}",
            f"{statistics.median(r.p99_ms for r in self.runs):.2f}",
            str(sum(r.errors for r in self.runs)),
            " / ".join(f"{r.rps:,.0f}" for r in self.runs),
            f"{self.worker_cpu_us:.0f}" if self.worker_cpu_us is not None else "-",
        ]

    @property
    def worker_cpu_us(self) -> float | None:
        figures = [r.worker_cpu_us for r in self.runs if r.worker_cpu_us is not None]
        return statistics.median(figures) if figures else None


def measure(
    servers: list[Server],
    world: World,
    script: Path,
    args: argparse.Namespace,
    rounds: int | None = None,
) -> list[Row]:
    """Rounds alternate between the servers: round 1 of each, round 2 of each, ..."""
    for server in servers:
        check_answers(server, world)
    rows = [Row(s) for s in servers]
    for n in range(args.rounds if rounds is None else rounds):
        for row in rows:
            row.runs.append(wrk(row.server, script, args))
            print(
                f"  round {n + 1}: {row.server.label:<34} {row.runs[-1].rps:9,.0f} req/s",
                file=sys.stderr,
            )
    for server in servers:
        check_answers(server, world, sample=20)
    return rows


def print_table(
    title: str, rows: list[Row], reference: Row, extra: dict[str, Row] | None = None
) -> None:
    print(f"\n{title}\n")
    head = [
        "server",
        "req/s (median)",
        "p50 ms",
        "p99 ms",
        "errors",
        "rounds req/s",
        "worker CPU µs/req",
        f"vs {reference.server.label}",
    ]
    extra = extra or {}
    head += [f"vs {r.server.label}" for r in extra.values()]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        ratios = [f"{row.rps / reference.rps:.3f}"] + [
            f"{row.rps / r.rps:.2f}" for r in extra.values()
        ]
        print("| " + " | ".join([row.server.label, *row.cells(), *ratios]) + " |")
