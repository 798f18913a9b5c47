"""Section storm: a login storm through the shipped nginx site, gunicorn.conf.py and authsvc.toml.

First the capacity: the most req/s wrk gets with a p99 under 20 ms. Then a storm
of ``--storm-factor`` times that (a list: one storm per factor) from
``--storm-connections`` paced clients for
``--storm-seconds``, once per UPSTREAM_MAX_CONNS of ``--storm-max-conns`` (0: no
limit, every request queues, and past the app's bound is shed by the app; ``0:0``
the site before both limits; ``N:W`` runs the app with AUTHSVC_MAX_QUEUE_WAIT=W,
else its default), then normal load again
until the p99 is back under 20 ms. Figures per answer status come from nginx's
access log (every request of the storm; nginx's own 503s one in 100, each such line
standing for 100), the client's view from wrk and from a probe opening a new
connection every 50 ms.

Pinned (``--storm-pin auto``, the default, when this process may run on 2 CPUs or
more): the load generator (wrk, the probe, this process) on the first half of the
CPUs, the server (nginx, gunicorn's master and workers: one worker per server CPU,
UPSTREAM_MAX_CONNS as scripts/install renders it for them) on the rest, as
``taskset -c`` would: on two cores, one each. The capacity and the storm are both
measured that way, so the storm's served fraction is the server's, not wrk's share
of the cores. With one CPU it says so and runs unpinned.

Then nginx's CPU per shed answer: nginx in front of an app host that never answers
(a unix socket nobody accepts on, UPSTREAM_MAX_CONNS=1 held by one request), so
every other request is nginx's JSON 503; the shipped site against the same site
logging every shed answer, in alternating rounds, from /proc (utime + stime of
nginx's processes), with clients sending back to back or, ``--storm-shed-rate N``,
paced as the storm's are (each request then wakes nginx on its own).
``--storm-shed-variants all`` adds candidates for a cheaper shed
answer (SHED_CANDIDATES, none shipped), and ``--storm-max-conns ''`` runs that table
alone, no storm. ``--storm-nginx-policy batch`` runs the storm's nginx as SCHED_BATCH
(its wakeups never preempt the worker on their shared core): an experiment, not
something shipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from authsvc.deployment import REQUESTS_PER_WORKER
from authsvc.settings import default
from benchmarks.bench.sections.nginx import nginx_in_front
from benchmarks.bench.serve import (
    LEGACY_HOST,
    Server,
    check_answers,
    gunicorn,
    wait_for,
    workers_cpu_seconds,
    wrk,
)
from benchmarks.bench.world import APPS, REPO, SHIPPED_ENV, World

P99_TARGET_MS = (
    20.0  # the capacity is the most req/s with a p99 under this, and recovery is reaching it again
)
CAPACITY_CONNECTIONS = (2, 4, 8, 16, 32)
NORMAL_SHARE = 0.5  # normal load after the storm: this share of the capacity
NORMAL_CONNECTIONS = 50
RECOVERY_SLICE_S = 1
RECOVERY_LIMIT_S = 30
CLIENT_TIMEOUT_S = 2  # wrk's default: a client that waits longer gives up (a timeout)
SHED_CLIENTS = 64  # wrk's connections in the shed-cost table
SHED_BODY = (
    '{"success":false,"error":503,"error_description":"Service temporarily unavailable, try again"}'
)

# Paced clients: after each answer a client waits a random time (mean: the first
# script argument, in ms) before its next request, so the offered rate is
# connections / mean wait whatever the answers; every answer is counted by status,
# and a 503 that is not the service's JSON with Retry-After, or any HTML, is counted apart.
STORM_SCRIPT = """-- written by benchmarks/bench (scripts/bench), storm section
local paths = {%(paths)s}
local shed_body = %(shed)s
local requests, n, i, mean_ms = {}, 0, 0, 0
local threads = {}
counts, bad_shed, html = {}, 0, 0
function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end
function init(args)
  mean_ms = tonumber(args[1])
  math.randomseed(os.time() * 1000 + id)
  for k, p in ipairs(paths) do requests[k] = wrk.format("GET", p) end
  n = #requests
  i = math.random(n) - 1
end
function delay()
  return math.random() * 2 * mean_ms
end
function request()
  i = i %% n + 1
  return requests[i]
end
function response(status, headers, body)
  local key = tostring(status)
  counts[key] = (counts[key] or 0) + 1
  local retry_after = headers["Retry-After"] or headers["retry-after"]
  if status == 503 and (body ~= shed_body or retry_after == nil) then
    bad_shed = bad_shed + 1
  end
  if string.sub(body, 1, 1) == "<" then html = html + 1 end
end
function done(summary, latency, _)
  local total, bad, h, parts = {}, 0, 0, {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("counts")) do total[k] = (total[k] or 0) + v end
    bad = bad + t:get("bad_shed")
    h = h + t:get("html")
  end
  for k, v in pairs(total) do table.insert(parts, string.format('"%%s":%%d', k, v)) end
  local e = summary.errors
  io.write(string.format('WRK_STORM {"requests":%%d,"duration_us":%%d,"p50_us":%%d,' ..
    '"p99_us":%%d,"max_us":%%d,' ..
    '"connect":%%d,"read":%%d,"write":%%d,"timeout":%%d,"bad_shed":%%d,"html":%%d,"statuses":{%%s}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout, bad, h, table.concat(parts, ",")))
end
"""

ACCESS_LINE = re.compile(
    r'"\S+ \S+ \S+" (\d{3}) \d+ \d+ ([\d.]+) upstream=.*? addr="([^"]*)".*?(?: sampled=1/(\d+))?$'
)
SHED_CLASS = (
    '"503:502:authsvc_app"    100;'  # the site's map line that logs nginx's shed 503s one in 100
)


@dataclasses.dataclass(frozen=True)
class Pinning:
    """Which CPUs the load generator and the server may run on (sched_setaffinity, as taskset
    -c)."""

    client: frozenset[int]
    server: frozenset[int]

    def describe(self) -> str:
        return (
            f"wrk, the probe and the bench on CPU {cpu_list(self.client)}; nginx and gunicorn on "
            f"CPU {cpu_list(self.server)} (as taskset -c)"
        )


def cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def pinning(mode: str) -> Pinning | None:
    """The split of this process's CPUs (os.sched_getaffinity): the first half for the client, the
    rest for the server; None when off or when there is only one."""
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "off":
        return None
    if len(cpus) < 2:
        print(
            f"bench: storm: only CPU {cpus[0]} is available to this process: NOT pinned, wrk "
            "shares the server's core (served / capacity then measures the two together)",
            file=sys.stderr,
        )
        return None
    half = len(cpus) // 2
    return Pinning(frozenset(cpus[:half]), frozenset(cpus[half:]))


@contextlib.contextmanager
def on_cpus(cpus: frozenset[int] | None):
    """This thread, and every process it starts meanwhile, on ``cpus`` (None: unchanged); restored
    after."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return out


def check_pinned(pin: Pinning | None, *procs: subprocess.Popen) -> None:
    """Every process of the server on the server's CPUs, or the run stops."""
    if pin is None:
        return
    for proc in procs:
        for pid in process_tree(proc.pid):
            with contextlib.suppress(FileNotFoundError):
                if frozenset(os.sched_getaffinity(pid)) != pin.server:
                    raise SystemExit(
                        f"bench: storm: process {pid} runs on CPU "
                        f"{cpu_list(frozenset(os.sched_getaffinity(pid)))}, "
                        f"not the server's {cpu_list(pin.server)}"
                    )


@dataclasses.dataclass
class Storm:
    label: str
    factor: float  # the offered load: this x the capacity measured before the storm
    cap_runs: list  # the capacity search before the storm: (wrk connections, Run)
    capacity_before: float
    capacity_after: float  # the best search load again, after the storm and the recovery
    wrk: dict  # WRK_STORM's figures
    seconds: float
    log: dict[str, list[float]]  # nginx's access log: request times (ms) by status
    shed_by_nginx: int  # 503s no app host saw (addr= the upstream's name): their logged lines x 100
    shed_by_app: int  # 503s an app host answered (AUTHSVC_MAX_QUEUE_WAIT; each logged)
    probes: list[
        tuple[int, float, bool]
    ]  # (status or 0 for a failure, ms, the service's JSON 503 with Retry-After)
    cores: dict[
        str, tuple[float, float]
    ]  # CPU used (cores): workers, nginx, wrk, at capacity and in the storm
    recovery_s: float | None = None
    worker_us: tuple[float, float] = (
        0.0,
        0.0,
    )  # workers' CPU µs per authentication served: at capacity, in the storm

    @property
    def capacity(self) -> float:
        """Measured before and after the storm on the same stack: the machine is shared and
        drifts."""
        return (self.capacity_before + self.capacity_after) / 2

    def count(self, status: str) -> int:
        return self.wrk["statuses"].get(status, 0)


def cpu_seconds(
    gunicorn_proc: subprocess.Popen | None,
    nginx_proc: subprocess.Popen,
    server_cpus: frozenset[int] | None = None,
) -> dict[str, float]:
    """CPU time so far of gunicorn's workers, nginx's workers and the children this process reaped
    (wrk); and the time the server's CPUs (all of them unpinned) were busy with anything
    (/proc/stat: other tenants, the kernel's softirq work, the server itself)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "workers": workers_cpu_seconds(gunicorn_proc) or 0.0,
        "nginx": workers_cpu_seconds(nginx_proc) or 0.0,
        "wrk": children.ru_utime + children.ru_stime,
        **cpus_busy_seconds(server_cpus),
    }


def cpus_busy_seconds(cpus: frozenset[int] | None) -> dict[str, float]:
    """Seconds these CPUs (None: all) were not idle, and of it in softirq (loopback's network work),
    from /proc/stat."""
    busy = softirq = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if (
            not name.startswith("cpu")
            or name == "cpu"
            or (cpus is not None and int(name[3:]) not in cpus)
        ):
            continue
        values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        busy += sum(values) - values[3] - values[4]
        softirq += values[6]
    tick = os.sysconf("SC_CLK_TCK")
    return {"busy": busy / tick, "softirq": softirq / tick}


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    return {name: (after[name] - before[name]) / seconds for name in before}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def storm_wrk(
    server: Server, script: Path, connections: int, seconds: int, rate: float, threads: int = 2
) -> tuple[dict, float]:
    """wrk with paced clients offering about ``rate`` req/s; its figures and the wall time it
    ran."""
    mean_ms = connections / rate * 1000
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        f"{CLIENT_TIMEOUT_S}s",
        "-H",
        f"Host: {server.host}",
        "-s",
        str(script),
        server.url + "/",
        "--",
        f"{mean_ms:.3f}",
    ]
    t0 = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    elapsed = time.monotonic() - t0
    match = re.search(r"^WRK_STORM (\{.*\})$", done.stdout, re.M)
    if done.returncode != 0 or not match:
        raise SystemExit(
            f"bench: wrk failed on {server.label}: {done.stderr.strip() or done.stdout[-500:]}"
        )
    return json.loads(match.group(1)), elapsed


def probe(server: Server, paths: list[str], stop: threading.Event, out: list) -> None:
    """A new client every 50 ms: its status, its time to the whole answer, and whether a 503 is the
    service's."""
    port = int(server.url.rsplit(":", 1)[1])
    k = 0
    while not stop.wait(0.05):
        k += 1
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
            conn.request("GET", paths[k % len(paths)], headers={"Host": server.host or ""})
            answer = conn.getresponse()
            body = answer.read()
            conn.close()
        except OSError:
            out.append((0, (time.perf_counter() - t0) * 1000, False))
            continue
        shed_ok = (
            answer.status == 503
            and body == SHED_BODY.encode()
            and answer.getheader("Retry-After") is not None
        )
        out.append((answer.status, (time.perf_counter() - t0) * 1000, shed_ok))


def read_access_log(path: Path, start: int) -> tuple[dict[str, list[float]], int, int]:
    """Request times (ms) by status from byte ``start`` of nginx's access log (of nginx's own 503s,
    the one in 100 logged); the 503s no app host saw, each logged line standing for the N of its
    "sampled=1/N"; and the 503s of an app host (each logged)."""
    times: dict[str, list[float]] = {}
    shed = by_app = 0
    with path.open("rb") as f:
        f.seek(start)
        for line in f.read().decode("ascii", "replace").splitlines():
            m = ACCESS_LINE.search(line)
            if m:
                times.setdefault(m.group(1), []).append(float(m.group(2)) * 1000)
                if m.group(1) == "503" and m.group(3) == "authsvc_app":
                    shed += int(m.group(4) or 1)
                elif m.group(1) == "503":
                    by_app += 1
    return times, shed, by_app


def capacity(server: Server, script: Path, args: argparse.Namespace) -> tuple[float, int, list]:
    """The most req/s of closed-loop wrk runs whose p99 stays under the target, every answer a 2xx;
    its connections."""
    runs = []
    for c in CAPACITY_CONNECTIONS:
        run = wrk(server, script, closed_loop(args, c))
        runs.append((c, run))
        print(
            f"  capacity: -c{c:<3} {run.rps:9,.0f} req/s, p99 {run.p99_ms:.1f} ms", file=sys.stderr
        )
        if run.p99_ms >= P99_TARGET_MS:
            break
    good = [(run.rps, c) for c, run in runs if run.p99_ms < P99_TARGET_MS and run.errors == 0]
    # None under the target (a machine busy with other work): the lightest load, shown as such in
    # the table.
    rps, c = max(good) if good else (runs[0][1].rps, runs[0][0])
    return rps, c, runs


def closed_loop(args: argparse.Namespace, connections: int) -> argparse.Namespace:
    return argparse.Namespace(
        **{**vars(args), "connections": connections, "duration": args.storm_capacity_seconds}
    )


def recovery(server: Server, script: Path, cap: float, storm_end: float) -> float | None:
    """Seconds from the storm's end to the end of the first 1 s of normal load with p99 under the
    target."""
    while time.monotonic() - storm_end < RECOVERY_LIMIT_S:
        figures, _ = storm_wrk(
            server, script, NORMAL_CONNECTIONS, RECOVERY_SLICE_S, cap * NORMAL_SHARE
        )
        errors = figures["connect"] + figures["read"] + figures["write"] + figures["timeout"]
        ok = figures["statuses"].get("200", 0) == figures["requests"] and errors == 0
        if ok and figures["p99_us"] / 1000 < P99_TARGET_MS:
            return time.monotonic() - storm_end
    return None


def server_workers(pin: Pinning | None) -> int:
    """gunicorn's workers: gunicorn.conf.py's default, one per CPU, of the CPUs the server runs
    on."""
    return len(pin.server) if pin else (os.cpu_count() or 1)


@contextlib.contextmanager
def stack(
    world: World,
    args: argparse.Namespace,
    logs: Path,
    max_conns: int,
    max_wait: float,
    pin: Pinning | None = None,
):
    """gunicorn with the shipped config and settings file (access_record = "edge") on a unix socket
    (AUTHSVC_MAX_QUEUE_WAIT=max_wait), the shipped
    site in front with this UPSTREAM_MAX_CONNS; both on the server's CPUs when pinned."""
    root = world.root / f"storm-{max_conns}-{max_wait:g}"
    sock = root / "authsvc.sock"
    root.mkdir(parents=True, exist_ok=True)
    env = {
        "AUTHSVC_BIND": f"unix:{sock}",
        "STATE_DIRECTORY": str(world.root),
        "AUTHSVC_MAX_QUEUE_WAIT": str(max_wait),
        "AUTHSVC_WORKERS": str(server_workers(pin)),
        **SHIPPED_ENV,
    }
    args_ = ("--config", str(REPO / "deploy" / "gunicorn.conf.py"))
    with contextlib.ExitStack() as servers:
        with on_cpus(pin.server if pin else None):
            proc = servers.enter_context(
                gunicorn(
                    world,
                    APPS["authsvc"],
                    logs / f"storm-{max_conns}-{max_wait:g}.log",
                    bind=f"unix:{sock}",
                    args=args_,
                    env=env,
                )
            )
            wait_for(sock.exists, "gunicorn (storm)", proc)
            # nginx's connection table: each storm client, and each request proxied, holds one.
            _, http_port, nginx = servers.enter_context(
                nginx_in_front(
                    world,
                    root,
                    sock,
                    overrides={"UPSTREAM_MAX_CONNS": str(max_conns)},
                    worker_connections=2 * args.storm_connections + 1024,
                    worker_processes=str(len(pin.server)) if pin else "auto",
                )
            )
        if args.storm_nginx_policy == "batch":
            for pid in process_tree(nginx.pid):
                os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
                if os.sched_getscheduler(pid) != os.SCHED_BATCH:
                    raise SystemExit(f"bench: storm: nginx process {pid} is not SCHED_BATCH")
        label = f"UPSTREAM_MAX_CONNS={max_conns}" + (" (no limit)" if max_conns == 0 else "")
        label += f" (AUTHSVC_MAX_QUEUE_WAIT={max_wait:g}" + (": off)" if max_wait == 0 else ")")
        label += ", nginx SCHED_BATCH" if args.storm_nginx_policy == "batch" else ""
        server = Server(
            label, "endpoint", f"http://127.0.0.1:{http_port}", host=LEGACY_HOST, master=proc
        )
        check_answers(server, world)
        check_pinned(pin, proc, nginx)
        yield server, root / "logs" / "authsvc-access.log", nginx
        check_answers(server, world, sample=20)
        check_pinned(pin, proc, nginx)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(
                f"bench: storm: {needed} open files needed (wrk and nginx), the limit is {hard}: "
                f"raise it (ulimit -n) or lower --storm-connections"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))  # inherited by wrk and nginx


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    raise_open_files(4 * args.storm_connections + 1024)
    storm_script = world.root / "storm.lua"
    storm_script.write_text(
        STORM_SCRIPT
        % {"paths": ",\n".join(json.dumps(p) for p in world.paths()), "shed": json.dumps(SHED_BODY)}
    )
    pin = pinning(args.storm_pin)
    # authsvc/deployment.py's default: REQUESTS_PER_WORKER x the workers, one per (server) CPU
    shipped = REQUESTS_PER_WORKER * server_workers(pin)
    rows = []
    for item in filter(
        None, args.storm_max_conns.split(",")
    ):  # "": no storm, the shed-cost table alone
        conns, _, wait = item.strip().partition(":")
        rows.append(
            (
                shipped if conns == "shipped" else int(conns),
                float(wait) if wait else default("max_queue_wait"),
            )
        )
    factors = storm_factors(args.storm_factor)
    with on_cpus(pin.client if pin else None):  # wrk and the probe: the client's CPUs
        storms = [
            one_storm(
                world,
                args,
                logs,
                script,
                storm_script,
                n,
                w,
                n == shipped and w == default("max_queue_wait"),
                pin,
                factor,
                len(factors) > 1,
            )
            for n, w in rows
            for factor in factors
        ]
        costs = shed_cost(world, args, pin) if args.storm_shed_seconds > 0 else []
    print_storm(args, storms, pin)
    print_shed_cost(args, costs)


def storm_factors(text: str) -> list[float]:
    """--storm-factor: one or more multiples of the capacity, comma-separated, each above 0."""
    try:
        factors = [float(item) for item in text.split(",")]
    except ValueError:
        raise SystemExit(
            f"bench: --storm-factor: not a number or a comma-separated list of numbers: {text!r}"
        ) from None
    if not all(0 < f < float("inf") for f in factors):
        raise SystemExit(f"bench: --storm-factor: each factor must be above 0: {text!r}")
    return factors


def one_storm(
    world: World,
    args: argparse.Namespace,
    logs: Path,
    script: Path,
    storm_script: Path,
    max_conns: int,
    max_wait: float,
    shipped: bool,
    pin: Pinning | None = None,
    factor: float = 4.0,
    name_factor: bool = False,
) -> Storm:
    """On a fresh stack: the capacity, the storm (with a probe), the recovery, the capacity
    again."""
    with stack(world, args, logs, max_conns, max_wait, pin) as (server, access_log, nginx):
        if shipped:
            server.label += f" (shipped: {REQUESTS_PER_WORKER} x {server_workers(pin)} workers)"
        if name_factor:  # several storm sizes: each row says its own
            server.label += f", {factor:g} x capacity"
        cap, best_c, cap_runs = capacity(server, script, args)
        start = access_log.stat().st_size
        probes: list = []
        stop = threading.Event()
        prober = threading.Thread(
            target=probe, args=(server, world.paths(), stop, probes), daemon=True
        )
        cpu0 = cpu_seconds(server.master, nginx, pin.server if pin else None)
        prober.start()
        figures, seconds = storm_wrk(
            server, storm_script, args.storm_connections, args.storm_seconds, cap * factor
        )
        storm_end = time.monotonic()
        in_storm = cores(
            cpu0, cpu_seconds(server.master, nginx, pin.server if pin else None), seconds
        )
        stop.set()
        prober.join()
        times, shed, by_app = read_access_log(access_log, start)
        recovered = recovery(server, storm_script, cap, storm_end)
        cpu0, t0 = cpu_seconds(server.master, nginx, pin.server if pin else None), time.monotonic()
        after = wrk(server, script, closed_loop(args, best_c))
        at_capacity = cores(
            cpu0,
            cpu_seconds(server.master, nginx, pin.server if pin else None),
            time.monotonic() - t0,
        )
        for c in (
            at_capacity,
            in_storm,
        ):  # the server CPUs' time nobody of ours used (wrk's too, unpinned)
            c["others"] = (
                c["busy"] - c["softirq"] - c["workers"] - c["nginx"] - (0.0 if pin else c["wrk"])
            )
        storm = Storm(
            server.label,
            factor,
            cap_runs,
            cap,
            after.rps,
            figures,
            figures["duration_us"] / 1e6,
            times,
            shed,
            by_app,
            probes,
            {k: (at_capacity[k], in_storm[k]) for k in in_storm},
            recovered,
        )
        # Worker CPU per authentication served: does shedding make serving dearer?
        storm.worker_us = (
            after.worker_cpu_us or 0.0,
            in_storm["workers"] * seconds / max(storm.count("200"), 1) * 1e6,
        )
        print(
            f"  storm: {server.label}: {storm.count('200') / storm.seconds:,.0f} auth/s served, "
            f"{storm.count('503') / storm.seconds:,.0f} 503/s; capacity {cap:,.0f} before, "
            f"{after.rps:,.0f} after",
            file=sys.stderr,
        )
        return storm


def ms(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"  # NaN: nothing of that kind


def print_storm(args: argparse.Namespace, storms: list[Storm], pin: Pinning | None = None) -> None:
    if not storms:
        return
    print(
        "\n10. Login storm: the shipped nginx site (legacy plain-HTTP host, rate and per-address "
        "limits raised out of the way), gunicorn.conf.py (sync, one worker per CPU) and "
        "authsvc.toml (access_record = edge); a fresh stack per row\n"
    )
    if pin:
        print(
            f"Pinned: {pin.describe()}; {server_workers(pin)} gunicorn worker(s) and nginx worker "
            "process(es), one per server CPU.\n"
        )
    else:
        print(
            f"Not pinned (--storm-pin {args.storm_pin}, CPUs available: "
            f"{cpu_list(frozenset(os.sched_getaffinity(0)))}): wrk, nginx and gunicorn share every "
            "core.\n"
        )
    print(
        "Capacity: the most req/s of closed-loop wrk (-c "
        f"{', '.join(map(str, CAPACITY_CONNECTIONS))}, {args.storm_capacity_seconds} s each, "
        f"stopping at the first p99 over {P99_TARGET_MS:.0f} ms) with a p99 under "
        f"{P99_TARGET_MS:.0f} ms, measured before the storm and again after it (the same "
        f"connections); the row's capacity is their mean. Storm: {args.storm_connections} paced "
        f"clients offering {args.storm_factor.replace(',', ', ')} x the capacity for "
        f"{args.storm_seconds} s, client timeout {CLIENT_TIMEOUT_S} s; then {NORMAL_SHARE:g} x "
        f"capacity in {RECOVERY_SLICE_S} s runs until one has a p99 under {P99_TARGET_MS:.0f} ms.\n"
    )
    head = [
        "nginx → gunicorn",
        "capacity req/s: before / after",
        "answers/s (x capacity)",
        "served auth/s",
        "served / capacity",
        "successes p50 / p99 / max ms",
        "503/s",
        "503 of them JSON + Retry-After",
        "503 time to answer p99 / max ms",
        "other statuses",
        "socket errors",
        "client timeouts",
        "back under 20 ms after",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in storms:
        w = s.wrk
        answered = w["requests"] / s.seconds
        served = s.count("200") / s.seconds
        ok, shed = s.log.get("200", []), s.log.get("503", [])
        others = {k: v for k, v in w["statuses"].items() if k not in ("200", "503")}
        recovered = (
            f"{s.recovery_s:.1f} s"
            if s.recovery_s is not None
            else f"not within {RECOVERY_LIMIT_S} s"
        )
        cells = [
            s.label,
            f"{s.capacity_before:,.0f} / {s.capacity_after:,.0f}",
            f"{answered:,.0f} ({answered / s.capacity:.1f})",
            f"{served:,.0f}",
            f"{served / s.capacity:.3f}",
            f"{ms(pct(ok, 50))} / {ms(pct(ok, 99))} / {ms(max(ok, default=float('nan')))}",
            f"{s.count('503') / s.seconds:,.0f}",
            f"{s.count('503') - w['bad_shed']:,} of {s.count('503'):,} (by nginx about "
            f"{s.shed_by_nginx:,}, by the app {s.shed_by_app:,})",
            f"{ms(pct(shed, 99))} / {ms(max(shed, default=float('nan')))}",
            ", ".join(f"{k}: {v}" for k, v in sorted(others.items())) or "none",
            str(w["connect"] + w["read"] + w["write"]),
            str(w["timeout"]),
            recovered,
        ]
        print("| " + " | ".join(cells) + " |")
    print(
        "\n   The clients' view (wrk over all answers; a probe opening a new connection every 50 "
        "ms), and the CPU each part used (cores, of the machine's 2) at capacity (the after run) "
        "and in the storm\n"
    )
    head = [
        "nginx → gunicorn",
        "wrk p50 / p99 / max ms",
        "probes",
        "probe 200 p99 ms",
        "probe 503 p99 / max ms",
        "probe 503 JSON + Retry-After",
        "probe failures",
        "HTML answers",
        "workers cores",
        "nginx cores",
        "wrk cores",
        "server CPUs busy (cores)",
        "of it softirq (network)",
        "of it no process of the bench (other tenants)",
        "worker CPU µs per auth served",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in storms:
        w = s.wrk
        ok = [t for status, t, _ in s.probes if status == 200]
        shed = [t for status, t, _ in s.probes if status == 503]
        cells = [
            s.label,
            f"{w['p50_us'] / 1000:.1f} / {w['p99_us'] / 1000:.1f} / {w['max_us'] / 1000:.1f}",
            str(len(s.probes)),
            ms(pct(ok, 99)),
            f"{ms(pct(shed, 99))} / {ms(max(shed, default=float('nan')))}",
            f"{sum(good for status, _, good in s.probes if status == 503)} of {len(shed)}",
            str(sum(status == 0 for status, _, _ in s.probes)),
            str(w["html"]),
            *(
                f"{s.cores[k][0]:.2f} → {s.cores[k][1]:.2f}"
                for k in ("workers", "nginx", "wrk", "busy", "softirq", "others")
            ),
            f"{s.worker_us[0]:.0f} → {s.worker_us[1]:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print("\n   The capacity search of each row (closed-loop wrk)\n")
    print(
        "| nginx → gunicorn | "
        + " | ".join(f"-c{c} req/s, p99 ms" for c in CAPACITY_CONNECTIONS)
        + " |"
    )
    print("|" + "---|" * (len(CAPACITY_CONNECTIONS) + 1))
    for s in storms:
        found = {
            c: f"{run.rps:,.0f}, {run.p99_ms:.1f}"
            + (f" ({run.errors} errors)" if run.errors else "")
            for c, run in s.cap_runs
        }
        print(
            f"| {s.label} | " + " | ".join(found.get(c, "-") for c in CAPACITY_CONNECTIONS) + " |"
        )
    print(
        "\nTargets: served ≥ 0.9 x capacity; successes' p99 ≤ 100 ms; every other answer the JSON "
        "503 with Retry-After within 100 ms; no client timeout (BENCHMARKS.md, section 9)."
    )


@dataclasses.dataclass
class ShedCost:
    label: str
    runs: list[tuple[int, float, int, int]] = dataclasses.field(
        default_factory=list
    )  # 503s, nginx CPU s, lines, bad

    @property
    def us(self) -> list[float]:
        return [cpu / n * 1e6 for n, cpu, _, _ in self.runs if n]


def every_shed_logged(root: Path) -> None:
    """The rendered site with each shed 503 logged, as before it sampled them: the reference."""
    site = root / "deploy" / "nginx" / "sites" / "authsvc.conf"
    text = site.read_text()
    if SHED_CLASS not in text:
        raise SystemExit(
            f"bench: storm: the site's map has no line {SHED_CLASS!r}: update "
            "benchmarks/bench/sections/storm.py"
        )
    site.write_text(text.replace(SHED_CLASS, SHED_CLASS.replace("100;", "1;")))


def _sub(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(
            f"bench: storm: {path.name} has no {old!r}: update benchmarks/bench/sections/storm.py"
        )
    path.write_text(text.replace(old, new, 1))


SHED_CONN_ZONE = "limit_conn_zone $authsvc_client zone=authsvc_conn:10m;\n"


def shed_by_limit_conn(root: Path) -> None:
    """Candidate, not shipped: shed before the proxy module. One limit_conn count for the whole site
    (a zone keyed by a constant), limit UPSTREAM_MAX_CONNS x app hosts (here 1 x 1, held),
    limit_conn_status 503 on the API location, and nginx's own 503 given Retry-After (@authsvc_503;
    the app's 503s are never intercepted). A location's limit_conn replaces the server's, so the
    per-address one is repeated there (and its status becomes 503 too: limit_conn_status is one per
    location)."""
    snippets = root / "deploy" / "nginx" / "snippets"
    _sub(
        root / "deploy" / "nginx" / "sites" / "authsvc.conf",
        SHED_CONN_ZONE,
        SHED_CONN_ZONE + "map $server_port $authsvc_everyone { default all; }\n"
        "limit_conn_zone $authsvc_everyone zone=authsvc_shed:64k;\n",
    )
    per_address = re.search(
        r"^limit_conn authsvc_conn \d+;$", (snippets / "authsvc-limits.conf").read_text(), re.M
    )
    if per_address is None:
        raise SystemExit(
            "bench: storm: authsvc-limits.conf has no per-address limit_conn: update storm.py"
        )
    _sub(
        snippets / "authsvc-proxy.conf",
        "proxy_pass http://authsvc_app;",
        f"{per_address.group(0)}\nlimit_conn authsvc_shed 1;\nlimit_conn_status 503;\nproxy_pass "
        "http://authsvc_app;",
    )
    errors = snippets / "authsvc-json-errors.conf"
    head = (
        "location @authsvc_503 {\n    include "
        + str(snippets / "authsvc-json-headers.conf")
        + ";\n"
    )
    _sub(errors, head, head + "    add_header Retry-After 1 always;\n")


def shed_by_limit_conn_unlogged(root: Path) -> None:
    """The limit_conn candidate with its 503s logged one in 100 like the proxy path's (no upstream:
    "503::")."""
    shed_by_limit_conn(root)
    _sub(
        root / "deploy" / "nginx" / "sites" / "authsvc.conf",
        SHED_CLASS,
        SHED_CLASS + '\n    "503::"                  100;',
    )


def plain_sampling_keys(root: Path) -> None:
    """The shipped path with the sampling map's regex keys dropped (only its exact keys): what the
    regexes cost."""
    site = root / "deploy" / "nginx" / "sites" / "authsvc.conf"
    _sub(site, '    "~^(429|444):"           100;\n', "")
    _sub(site, '    "~^(400|408|414):-?:"    100;\n', "")


def shed_unlogged(root: Path) -> None:
    """The shipped path with no shed 503 logged at all: what the sampled access log costs."""
    site = root / "deploy" / "nginx" / "sites" / "authsvc.conf"
    _sub(site, '    "100:0"  0;\n', '    "100:0"  0;\n    "100:1"  0;\n')


def fewer_proxy_headers(root: Path) -> None:
    """The shipped path without the proxy_set_header lines that evaluate a variable (Content-Type,
    Host, X-Request-Start; rendered for access_record = "edge", nginx sends no X-Forwarded-* or
    X-Request-Id): what building them costs on a shed answer. Not servable."""
    proxy = root / "deploy" / "nginx" / "snippets" / "authsvc-proxy.conf"
    text = proxy.read_text()
    lines = [
        line
        for line in text.splitlines(keepends=True)
        if not (line.startswith("proxy_set_header") and "$" in line)
    ]
    if len(lines) != len(text.splitlines()) - 3:
        raise SystemExit(
            "bench: storm: authsvc-proxy.conf's proxy_set_header lines changed: update storm.py"
        )
    proxy.write_text("".join(lines))


def answer_without_proxy(root: Path) -> None:
    """A floor, not a candidate: the API location answers the JSON 503 itself (return, in the
    rewrite phase: before limit_req and the proxy module), every one logged."""
    snippets = root / "deploy" / "nginx" / "snippets"
    _sub(
        snippets / "authsvc-proxy.conf",
        "proxy_pass http://authsvc_app;",
        f"include {snippets / 'authsvc-json-headers.conf'};\nadd_header Retry-After 1 always;\n"
        f"return 503 '{SHED_BODY}';\nproxy_pass http://authsvc_app;",
    )


def answer_without_proxy_unlogged(root: Path) -> None:
    """The floor with no access log in the API location: what nginx spends on any keep-alive answer
    at all."""
    answer_without_proxy(root)
    _sub(
        root / "deploy" / "nginx" / "snippets" / "authsvc-proxy.conf",
        "proxy_pass http://authsvc_app;",
        "access_log off;\nproxy_pass http://authsvc_app;",
    )


SHED_VARIANTS = [
    ("shipped: shed 503s logged 1 in 100", None),
    ("every shed 503 logged (the site before)", every_shed_logged),
]
# --storm-shed-variants all: candidates for a cheaper shed answer, measured, none shipped
# (BENCHMARKS.md, "Login storm")
SHED_CANDIDATES = [
    ("candidate: sampling map without regex keys", plain_sampling_keys),
    ("candidate: shed 503s not logged at all", shed_unlogged),
    ("candidate: no variable proxy_set_header", fewer_proxy_headers),
    ("candidate: limit_conn shed (every 503 logged)", shed_by_limit_conn),
    ("candidate: limit_conn shed (logged 1 in 100)", shed_by_limit_conn_unlogged),
    ("floor: return 503 in the API location (every 503 logged)", answer_without_proxy),
    ("floor: return 503 in the API location, access_log off", answer_without_proxy_unlogged),
]


def shed_cost(world: World, args: argparse.Namespace, pin: Pinning | None) -> list[ShedCost]:
    """nginx's CPU per shed 503: both sites up at once in front of an app host that never answers,
    wrk (closed loop, keep-alive, the storm script checking every answer) on each in turn,
    ``args.rounds`` rounds."""
    storm_script = world.root / "storm.lua"
    variants = SHED_VARIANTS + (SHED_CANDIDATES if args.storm_shed_variants == "all" else [])
    rows = [ShedCost(label) for label, _ in variants]
    with contextlib.ExitStack() as stacks:
        servers = []
        for k, (label, edit) in enumerate(variants):
            root = world.root / f"storm-shed-{k}"
            root.mkdir(parents=True, exist_ok=True)
            sock = root / "silent.sock"
            listener = stacks.enter_context(socket.socket(socket.AF_UNIX))
            listener.bind(str(sock))
            listener.listen(64)  # connections wait here unanswered: the app host is full at 1
            overrides = {
                "UPSTREAM_MAX_CONNS": "1",
                "RATE_DELAY": "1000",
                "UPSTREAM_TIMEOUT": "600s",
            }
            with on_cpus(pin.server if pin else None):
                _, port, nginx = stacks.enter_context(
                    nginx_in_front(
                        world,
                        root,
                        sock,
                        overrides=overrides,
                        worker_processes=str(len(pin.server)) if pin else "auto",
                        edit=edit,
                    )
                )
            check_pinned(pin, nginx)
            held = stacks.enter_context(socket.create_connection(("127.0.0.1", port)))
            held.sendall(f"GET {world.paths()[0]} HTTP/1.1\r\nHost: {LEGACY_HOST}\r\n\r\n".encode())
            server = Server(label, "endpoint", f"http://127.0.0.1:{port}", host=LEGACY_HOST)
            wait_for(lambda s=server: shed_once(s, world), f"nginx ({label}) shedding", nginx)
            servers.append((server, nginx, root / "logs" / "authsvc-access.log"))
        for _round in range(args.rounds):
            for row, (server, nginx, log) in zip(rows, servers, strict=True):
                lines0 = count_lines(log)
                cpu0 = workers_cpu_seconds(nginx) or 0.0
                figures, _ = storm_wrk(
                    server,
                    storm_script,
                    SHED_CLIENTS,
                    args.storm_shed_seconds,
                    args.storm_shed_rate or 1e9,
                    threads=1,
                )
                cpu = (workers_cpu_seconds(nginx) or 0.0) - cpu0
                time.sleep(0.2)  # the last lines
                row.runs.append(
                    (
                        figures["statuses"].get("503", 0),
                        cpu,
                        count_lines(log) - lines0,
                        figures["requests"]
                        - (figures["statuses"].get("503", 0) - figures["bad_shed"]),
                    )
                )
                print(
                    f"  shed cost: {row.label}: {row.us[-1]:.1f} µs of nginx CPU per shed 503",
                    file=sys.stderr,
                )
    return rows


def shed_clients(args: argparse.Namespace) -> str:
    if args.storm_shed_rate:
        return f"paced clients offering {args.storm_shed_rate:,.0f} req/s in all (as the storm's)"
    return "each client's next request as soon as its answer arrives"


def shed_once(server: Server, world: World) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=5)
    try:
        conn.request("GET", world.paths()[1], headers={"Host": server.host or ""})
        answer = conn.getresponse()
        return answer.status == 503 and answer.read() == SHED_BODY.encode()
    except OSError:  # admitted before the held request: it waited for the silent host
        return False
    finally:
        conn.close()


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def print_shed_cost(args: argparse.Namespace, costs: list[ShedCost]) -> None:
    if not costs:
        return
    others = (
        " and the candidates for a cheaper shed answer (none shipped)"
        if len(costs) > len(SHED_VARIANTS)
        else ""
    )
    print(
        "\n   nginx's CPU per shed answer: the shipped site against the same site logging every "
        f"shed 503{others}, all in front of an app host that never answers (UPSTREAM_MAX_CONNS=1, "
        f"held), wrk -t1 -c{SHED_CLIENTS} keep-alive, {shed_clients(args)}, for "
        f"{args.storm_shed_seconds} s on each in turn, {args.rounds} rounds; nginx's CPU from "
        "/proc (utime + stime)\n"
    )
    head = [
        "nginx site",
        "shed 503s answered",
        "nginx CPU µs per shed 503: median (runs)",
        "vs every shed logged",
        "access-log lines per 1,000 shed 503s",
        "answers not the JSON 503 with Retry-After",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    reference = (
        statistics.median(costs[1].us) if costs[1].us else float("nan")
    )  # every shed 503 logged
    for c in costs:
        answered = sum(n for n, _, _, _ in c.runs)
        median = statistics.median(c.us) if c.us else float("nan")
        cells = [
            c.label,
            f"{answered:,}",
            f"{median:.1f} ({', '.join(f'{u:.1f}' for u in c.us)})",
            f"{median / reference:.2f}",
            f"{sum(lines for _, _, lines, _ in c.runs) / max(answered, 1) * 1000:.1f}",
            str(sum(bad for _, _, _, bad in c.runs)),
        ]
        print("| " + " | ".join(cells) + " |")
