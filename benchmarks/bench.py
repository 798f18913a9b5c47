"""The benchmark behind scripts/bench and BENCHMARKS.md: authsvc against a bare WSGI app and Flask.

Every figure that matters is a ratio against a reference measured in the same
run, rounds alternating between the apps, because the machines are shared and
noisy. Sections (``--only``, default all):

  core      bare app, authsvc (SQLite, 100,000 players) and Flask under identical
            gunicorn settings, wrk over loopback TCP; plus each app's in-process
            cost per call (the WSGI callable called directly, no server)
  nginx     the shipped nginx site (legacy plain-HTTP host, and the HTTPS host)
            in front of the shipped gunicorn.conf.py on a unix socket: sync
            against gthread workers, nginx keeping upstream connections alive
  postgres  authsvc on PostgreSQL (the same players, moved with authsvc
            export/import) against authsvc on SQLite, through gunicorn
  scale     in-process cost per authentication with 100,000 against 10,000,000
            players (SQLite)
  profile   py-spy on one authsvc worker under wrk: where a request's time goes
  cold      in-process cost with the CPU caches emptied before each call, as in a
            worker between requests
  bodies    in-process cost of the costliest request bodies of at most 16 KiB
            (tests/hostile_bodies.py: the multipart bodies that made email.parser
            spend ~200 ms, and the worst found for each parser since) against a
            plain form with the same three fields

Each server is checked before it is measured (a valid request, a 403 and a 400
must answer as documented) and after (valid requests still succeed), so a broken
server cannot look fast. Only loopback is used; every wrk run is bounded by
``--duration``. Run it with ``scripts/bench`` (it makes the venv and finds wrk).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import platform
import random
import re
import secrets
import shutil
import socket
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import wsgiref.util
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from authsvc.app import App, make_app  # noqa: E402
from authsvc.settings import Settings  # noqa: E402
from authsvc.store import open_store  # noqa: E402
from authsvc.tokens import api_key_digest, mint_token, new_api_key, new_token_secret  # noqa: E402
from tests.deploy_support import stop  # noqa: E402  (the suite's helpers: stop a server's process group)
from tests.support import free_port  # noqa: E402

PATH = "/api/authenticate.json"
VENV_BIN = Path(sys.executable).parent
APPS = {
    "bare": "benchmarks.bare:application",
    "plain": "benchmarks.plain_app:application",
    "authsvc": "authsvc.wsgi:application",
    "flask": "benchmarks.flask_app:application",
}
SAMPLE = 1000  # distinct players in the request mix
SCALE_SAMPLE = 20_000  # the scale section's: more leaf pages than SQLite's page cache holds
API_HOST, LEGACY_HOST = "localhost", "legacy.bench.test"  # the nginx section's two hosts


# -- the data ---------------------------------------------------------------------------


@dataclasses.dataclass
class World:
    """A store with one game and N players, the secret, and a sample of valid requests."""

    root: Path
    store_url: str
    secret_file: Path
    api_key: str
    game_id: int
    players: int
    user_ids: list[int]
    secret: bytes

    @property
    def env(self) -> dict[str, str]:
        return {"AUTHSVC_STORE": self.store_url, "AUTHSVC_TOKEN_SECRET_FILE": str(self.secret_file)}

    def query(self, user_id: int, **overrides) -> str:
        params = {
            "user_id": str(user_id),
            "game_auth_token": mint_token(self.secret, self.game_id, user_id, 0),
            "api_key": self.api_key,
        }
        params.update(overrides)
        return "&".join(f"{k}={v}" for k, v in params.items() if v is not None)

    def paths(self) -> list[str]:
        return [f"{PATH}?{self.query(uid)}" for uid in self.user_ids]


def username(user_id: int) -> str:
    return f"player{user_id}"


def make_world(root: Path, players: int, seed: int = 1) -> World:
    """A fresh SQLite store of ``players`` players (user ids 1..N) and one game; timed in the output."""
    root.mkdir(parents=True, exist_ok=True)
    secret_file = root / "token-secret"
    secret_file.write_text(new_token_secret() + "\n")
    secret_file.chmod(0o600)
    url = f"sqlite://{root}/authsvc.db"
    settings = Settings.from_env({"AUTHSVC_STORE": url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)})
    store = open_store(url, readonly=False, settings=settings)
    try:
        store.migrate()
        api_key = new_api_key()
        game = store.add_game("Bench", api_key_digest(api_key), int(time.time()))
        store.add_game("Other", api_key_digest(new_api_key()), int(time.time()))
        store.upsert_players((i, username(i)) for i in range(1, players + 1))
    finally:
        store.close()
    rng = random.Random(seed)
    user_ids = [rng.randint(1, players) for _ in range(SAMPLE)]
    return World(root, url, secret_file, api_key, game.id, players, user_ids, settings.token_secrets[0])


# -- servers ------------------------------------------------------------------------------


def wait_for(check: Callable[[], bool], what: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise SystemExit(f"bench: {what} exited with code {proc.returncode}; see {proc.args[0]}'s log above")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not ready after {timeout}s")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@dataclasses.dataclass
class Server:
    """One running server and how to reach it; ``label`` names it in the tables."""

    label: str
    kind: str  # "bare" (its fixed body) or "endpoint" (the documented answers): what the checks expect
    url: str  # base URL wrk and the checks use
    host: str | None = None  # Host header to send (nginx virtual hosts)
    ca_file: str | None = None  # the CA that signed an HTTPS server's certificate
    master: subprocess.Popen | None = None  # gunicorn's master, to read its workers' CPU time


@contextlib.contextmanager
def gunicorn(world: World, app: str, log: Path, *, bind: str, args: tuple[str, ...] = (),
             env: dict | None = None) -> Iterator[subprocess.Popen]:
    """gunicorn serving ``app``; the same flags for every app unless ``args`` adds some."""
    command = [str(VENV_BIN / "gunicorn"), "--bind", bind, "--no-control-socket", *args, app]
    full_env = {**os.environ, **world.env, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.Popen(command, env=full_env, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        stop(proc)


def core_gunicorn_args(workers: int) -> tuple[str, ...]:
    return ("--workers", str(workers), "--worker-class", "sync", "--preload", "--log-level", "warning")


# -- checks -------------------------------------------------------------------------------


def fetch(server: Server, query: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{server.url}{PATH}?{query}", headers={"Host": server.host} if server.host else {})
    context = ssl.create_default_context(cafile=server.ca_file) if server.ca_file else None
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return response.status, response.read()


def check_answers(server: Server, world: World, sample: int = 3) -> None:
    """The valid, 403 and 400 cases answer as documented (bare: its fixed body), or the run stops."""
    from benchmarks.bare import BODY

    def expect(query: str, want: dict | bytes) -> None:
        try:
            status, body = fetch(server, query)
        except OSError as e:
            raise SystemExit(f"bench: {server.label} did not answer: {e}") from None
        got = body if isinstance(want, bytes) else json.loads(body)
        if status != 200 or got != want:
            raise SystemExit(f"bench: {server.label} answered {status} {body[:200]!r}, expected {want!r}")

    uid = world.user_ids[0]
    if server.kind == "bare":
        expect(world.query(uid), BODY)
        return
    for uid in world.user_ids[:sample]:
        expect(world.query(uid), {"success": True, "user_id": uid, "username": username(uid)})
    expect(world.query(uid, game_auth_token="0" * 64),
           {"success": False, "error": 403, "error_description": "Invalid credentials"})
    expect(world.query(uid, api_key=None), {
        "success": False, "error": 400,
        "error_description": "user_id, game_auth_token, and api_key are required parameters",
    })


# -- wrk ----------------------------------------------------------------------------------

WRK_SCRIPT = """-- written by benchmarks/bench.py: cycle through valid requests of many players
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
  io.write(string.format('WRK_RESULT {"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,' ..
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
    command = ["wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{args.duration}s", "--timeout", "5s",
               "-s", str(script)]
    if server.host:
        command += ["-H", f"Host: {server.host}"]
    done = subprocess.run([*command, server.url + "/"], capture_output=True, text=True,
                          timeout=args.duration + 60)
    match = re.search(r"^WRK_RESULT (\{.*\})$", done.stdout, re.M)
    if done.returncode != 0 or not match:
        raise SystemExit(f"bench: wrk failed on {server.label}: {done.stderr.strip() or done.stdout[-500:]}")
    cpu_after = workers_cpu_seconds(server.master)
    r = json.loads(match.group(1))
    errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    cpu_us = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / r["requests"] * 1e6
    return Run(r["requests"] / (r["duration_us"] / 1e6), r["p50_us"] / 1000, r["p99_us"] / 1000, errors, cpu_us)


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


def measure(servers: list[Server], world: World, script: Path, args: argparse.Namespace,
            rounds: int | None = None) -> list[Row]:
    """Rounds alternate between the servers: round 1 of each, round 2 of each, ..."""
    for server in servers:
        check_answers(server, world)
    rows = [Row(s) for s in servers]
    for n in range(args.rounds if rounds is None else rounds):
        for row in rows:
            row.runs.append(wrk(row.server, script, args))
            print(f"  round {n + 1}: {row.server.label:<34} {row.runs[-1].rps:9,.0f} req/s", file=sys.stderr)
    for server in servers:
        check_answers(server, world, sample=20)
    return rows


def print_table(title: str, rows: list[Row], reference: Row, extra: dict[str, Row] | None = None) -> None:
    print(f"\n{title}\n")
    head = ["server", "req/s (median)", "p50 ms", "p99 ms", "errors", "rounds req/s", "worker CPU µs/req",
            f"vs {reference.server.label}"]
    extra = extra or {}
    head += [f"vs {r.server.label}" for r in extra.values()]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        ratios = [f"{row.rps / reference.rps:.3f}"] + [f"{row.rps / r.rps:.2f}" for r in extra.values()]
        print("| " + " | ".join([row.server.label, *row.cells(), *ratios]) + " |")


# -- in-process cost ------------------------------------------------------------------------


def environs(world: World, sample: int | None = None) -> list[dict]:
    """Complete WSGI environs (what Flask needs too): the world's sample of valid requests, or a new one."""
    rng = random.Random(sample)
    user_ids = world.user_ids if sample is None else [rng.randint(1, world.players) for _ in range(sample)]
    out = []
    for uid in user_ids:
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": PATH, "QUERY_STRING": world.query(uid),
                   "wsgi.input": io.BytesIO(b"")}
        wsgiref.util.setup_testing_defaults(environ)
        out.append(environ)
    return out


def per_call_us(app, envs: list[dict], calls: int, repeats: int, check: Callable[[bytes], bool]) -> list[float]:
    """``repeats`` figures, each the mean wall time of one call over ``calls`` calls."""

    def start_response(status, headers, exc_info=None):
        return None

    for environ in envs:  # warm up, and refuse to time an app that answers wrongly
        body = b"".join(app(dict(environ), start_response))
        if not check(body):
            raise SystemExit(f"bench: in-process call answered {body[:200]!r}")
    n = len(envs)
    figures = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in range(calls):
            b"".join(app(dict(envs[k % n]), start_response))
        figures.append((time.perf_counter() - t0) / calls * 1e6)
    return figures


@dataclasses.dataclass
class PerCall:
    """In-process figures of one app: best (the least disturbed, as timeit reports) and median."""

    figures: list[float] = dataclasses.field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.figures)

    @property
    def median(self) -> float:
        return statistics.median(self.figures)


def in_process(world: World, args: argparse.Namespace) -> dict[str, PerCall]:
    from benchmarks import bare, flask_app, plain_app

    envs = environs(world)
    settings = Settings.from_env(world.env)
    db_path = world.store_url.removeprefix("sqlite://")
    # Metrics as gunicorn.conf.py runs them: prometheus_client's multiprocess mode (a value is
    # an mmap write), chosen when it is first imported, here. The variable is dropped afterwards so
    # that the gunicorn runs of later sections do not share the directory.
    metrics_dir = tempfile.mkdtemp(prefix="bench-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    authsvc = make_app(settings)
    if authsvc.metrics is None:
        raise SystemExit("bench: the metrics extra is not installed (pip install -e '.[metrics]')")
    authsvc_off = App(settings, authsvc.store)  # the same store, no metrics
    check_success = lambda body: body.startswith(b'{"success":true,')  # noqa: E731
    apps = {
        "bare": (bare.application, lambda body: body == bare.BODY, args.calls),
        "plain": (plain_app.create_app(db_path, world.secret), lambda body: b'"success":true' in body, args.calls),
        "authsvc": (authsvc_off, check_success, args.calls),
        "authsvc, metrics on": (authsvc, check_success, args.calls),
        "flask": (flask_app.create_app(db_path, world.secret), lambda body: b'"success":true' in body,
                  max(args.calls // 5, 1)),
    }
    figures = {name: PerCall() for name in [*apps, "store"]}
    digest = api_key_digest(world.api_key)
    store_calls = [(digest, uid) for uid in world.user_ids]
    for _ in range(3):  # alternate, like the wrk rounds
        for name, (app, check, calls) in apps.items():
            figures[name].figures += per_call_us(app, envs, max(calls // 5, 1), 5, check)
        for _ in range(5):
            t0 = time.perf_counter()
            for k in range(args.calls // 5):
                authsvc.store.credentials(*store_calls[k % len(store_calls)])
            figures["store"].figures.append((time.perf_counter() - t0) / (args.calls // 5) * 1e6)
    authsvc.store.close()
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    shutil.rmtree(metrics_dir, ignore_errors=True)
    return figures


def print_in_process(figures: dict[str, PerCall], world: World) -> None:
    print(f"\nIn-process cost per call (the WSGI callable called directly, {world.players:,} players, "
          "random players; 3 alternating rounds of 5 runs: best and median of the 15)\n")
    print("| app | µs per call, best | median | best vs plain | best vs Flask |")
    print("|---|---|---|---|---|")
    for name in ("bare", "plain", "authsvc", "authsvc, metrics on", "flask", "store"):
        label = "authsvc: store.credentials() alone" if name == "store" else name
        f = figures[name]
        print(f"| {label} | {f.best:.2f} | {f.median:.2f} | {f.best / figures['plain'].best:.3f} | "
              f"{f.best / figures['flask'].best:.3f} |")
    on, off = figures["authsvc, metrics on"], figures["authsvc"]
    print(f"\nMetrics cost (multiprocess mode, as under gunicorn.conf.py): +{on.best - off.best:.2f} µs best, "
          f"+{on.median - off.median:.2f} µs median (target: within 3 µs)")


# -- sections ---------------------------------------------------------------------------------


def section_core(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    servers = []
    with contextlib.ExitStack() as stack:
        for name in APPS:
            port = free_port()
            proc = stack.enter_context(gunicorn(world, APPS[name], logs / f"core-{name}.log",
                                                bind=f"127.0.0.1:{port}", args=core_gunicorn_args(args.workers)))
            wait_for(lambda port=port: port_open(port), f"gunicorn ({name})", proc)
            kind = "bare" if name == "bare" else "endpoint"
            servers.append(Server(name, kind, f"http://127.0.0.1:{port}", master=proc))
        rows = measure(servers, world, script, args)
    bare, plain, authsvc, flask = rows
    print_table(
        f"1. Through gunicorn ({args.workers} sync workers, --preload, loopback TCP), "
        f"wrk -t{args.threads} -c{args.connections} -d{args.duration}s, {args.rounds} alternating rounds, "
        f"{world.players:,} players",
        rows, bare, {"flask": flask},
    )
    figures = in_process(world, args)
    print_in_process(figures, world)
    print("\nTargets: authsvc/bare >= 0.95: {:.3f} | authsvc/Flask >= 1.5: {:.2f} | in-process <= 8 µs: {:.2f} "
          "({:.2f} x plain; 8 µs was 0.44 x plain on the issue's machine) | p99 <= 10 ms: {:.2f}".format(
              authsvc.rps / bare.rps, authsvc.rps / flask.rps, figures["authsvc"].best,
              figures["authsvc"].best / figures["plain"].best, statistics.median(r.p99_ms for r in authsvc.runs)))


@contextlib.contextmanager
def nginx_in_front(world: World, root: Path, sock: Path) -> Iterator[tuple[int, int, subprocess.Popen]]:
    """The shipped nginx site rendered as scripts/install renders it, the rate limit raised out of the way."""
    import trustme

    from tests.deploy_support import find_nginx, ipv6_loopback, nginx_main_conf  # shared with the suite

    nginx = find_nginx()
    if nginx is None:
        raise SystemExit("bench: the nginx section needs nginx (Debian: apt-get install nginx)")
    for d in ("logs", "tmp", "acme"):
        (root / d).mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert(API_HOST)
    cert.cert_chain_pems[0].write_to_path(str(root / "cert.pem"))
    cert.private_key_pem.write_to_path(str(root / "key.pem"))
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    https_port, http_port = free_port(), free_port()
    # wrk sends the URL's host name as SNI, so the HTTPS host is "localhost", on
    # both loopback addresses in case it resolves to ::1 first.
    https_listen = f"127.0.0.1:{https_port}" + (f" [::1]:{https_port}" if ipv6_loopback() else "")
    values = {
        "API_HOST": API_HOST, "LEGACY_HOST": LEGACY_HOST,
        "HTTPS_LISTEN": https_listen, "HTTP_LISTEN": f"127.0.0.1:{http_port}",
        "METRICS_LISTEN": f"127.0.0.1:{free_port()}",
        "HTTPS_URL": f"https://{API_HOST}:{https_port}",
        "TLS_CERT": str(root / "cert.pem"), "TLS_KEY": str(root / "key.pem"), "SOCKET": str(sock),
        "NGINX_DIR": str(root / "deploy" / "nginx"), "NGINX_LOG_DIR": str(root / "logs"),
        "ACME_ROOT": str(root / "acme"),
        "RATE": "1000000r/s", "RATE_BURST": "100000", "CONN_LIMIT": "100000",  # throughput, not the limiters
    }
    sets = [a for name, value in values.items() for a in ("--set", f"{name}={value}")]
    subprocess.run([sys.executable, "-m", "authsvc.deploy", str(REPO / "deploy"), str(root / "deploy"), *sets],
                   check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    conf = root / "nginx.conf"
    site = root / "deploy" / "nginx" / "sites" / "authsvc.conf"
    conf.write_text(nginx_main_conf(root, root / "logs", site, worker_processes="auto", worker_connections=1024))
    proc = subprocess.Popen([nginx, "-p", str(root), "-c", str(conf), "-g", "daemon off;"],
                            stdout=(root / "logs" / "nginx.out").open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_for(lambda: port_open(http_port) and port_open(https_port), "nginx", proc)
        yield https_port, http_port, proc
    finally:
        stop(proc)


NGINX_CONFIGS = [
    # label, app, AUTHSVC_WORKER_CLASS, AUTHSVC_WORKERS, AUTHSVC_THREADS
    ("bare, sync x2", "bare", "sync", 2, 1),
    ("authsvc, sync x2", "authsvc", "sync", 2, 1),
    ("authsvc, sync x5 (2 x CPUs + 1)", "authsvc", "sync", 5, 1),
    ("bare, gthread x2 x4 threads", "bare", "gthread", 2, 4),
    ("authsvc, gthread x2 x4 threads", "authsvc", "gthread", 2, 4),
]


def section_nginx(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """One nginx; the gunicorn configurations in turn behind it on one unix socket, each round."""
    root = world.root / "nginx"
    sock = root / "authsvc.sock"
    rows: dict[str, Row] = {}
    https_rows: dict[str, Row] = {}
    with nginx_in_front(world, root, sock) as (https_port, http_port, _):
        for _round in range(args.rounds):
            for label, kind, worker_class, workers, threads in NGINX_CONFIGS:
                env = {"AUTHSVC_BIND": f"unix:{sock}", "AUTHSVC_WORKER_CLASS": worker_class,
                       "AUTHSVC_WORKERS": str(workers), "AUTHSVC_THREADS": str(threads),
                       "STATE_DIRECTORY": str(world.root)}
                args_ = ("--config", str(REPO / "deploy" / "gunicorn.conf.py"))
                with gunicorn(world, APPS[kind], logs / f"nginx-{kind}-{worker_class}-{workers}.log",
                              bind=f"unix:{sock}", args=args_, env=env) as proc:
                    wait_for(sock.exists, f"gunicorn ({label})", proc)
                    kind_ = "bare" if kind == "bare" else "endpoint"
                    http = Server(label, kind_, f"http://127.0.0.1:{http_port}", host=LEGACY_HOST, master=proc)
                    https = Server(label, kind_, f"https://{API_HOST}:{https_port}", ca_file=str(root / "ca.pem"),
                                   master=proc)
                    row_http, row_https = measure([http, https], world, script, args, rounds=1)
                rows.setdefault(label, Row(http)).runs += row_http.runs
                https_rows.setdefault(label, Row(https)).runs += row_https.runs
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()
    rows, https_rows = list(rows.values()), list(https_rows.values())
    print_table(
        f"2. Through the shipped nginx site (unix socket, upstream keep-alive) and gunicorn.conf.py, "
        f"legacy plain-HTTP host, wrk -t{args.threads} -c{args.connections} -d{args.duration}s",
        rows, rows[0],
    )
    print_table("   The same on the HTTPS host (TLS 1.3, connections kept alive by wrk)", https_rows, https_rows[0])


def section_postgres(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    import psycopg

    url = args.pg
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as e:
        raise SystemExit(f"bench: the postgres section needs a PostgreSQL server (--pg): {type(e).__name__}") from None
    database = "authsvc_bench_" + secrets.token_hex(4)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    pg_url = urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + database))
    try:
        cli = [sys.executable, "-m", "authsvc.cli"]
        export = world.root / "export.jsonl"
        export.unlink(missing_ok=True)
        subprocess.run([*cli, "export", str(export)], env={**os.environ, **world.env}, check=True,
                       stdout=subprocess.DEVNULL)
        pg_env = {**os.environ, **world.env, "AUTHSVC_STORE": pg_url}
        subprocess.run([*cli, "init"], env=pg_env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "import", str(export)], env=pg_env, check=True, stdout=subprocess.DEVNULL)
        servers = []
        with contextlib.ExitStack() as stack:
            # The third row: PostgreSQL with the worker count docs/operations.md advises for it
            # (a worker waits for each round trip, so more workers than CPUs fill the gaps).
            pg_workers = 2 * (os.cpu_count() or 1) + 1
            for label, store_env, workers in (
                ("authsvc, SQLite", {}, args.workers),
                ("authsvc, PostgreSQL", {"AUTHSVC_STORE": pg_url}, args.workers),
                (f"authsvc, PostgreSQL, {pg_workers} workers", {"AUTHSVC_STORE": pg_url}, pg_workers),
            ):
                port = free_port()
                proc = stack.enter_context(gunicorn(world, APPS["authsvc"], logs / f"pg-{len(servers)}.log",
                                                    bind=f"127.0.0.1:{port}", args=core_gunicorn_args(workers),
                                                    env=store_env))
                wait_for(lambda port=port: port_open(port), f"gunicorn ({label})", proc)
                servers.append(Server(label, "endpoint", f"http://127.0.0.1:{port}", master=proc))
            rows = measure(servers, world, script, args)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    print_table(
        f"3. PostgreSQL against SQLite, the same {world.players:,} players, through gunicorn "
        f"({args.workers} sync workers unless the row says otherwise, loopback TCP; PostgreSQL on this machine)",
        rows, rows[0],
    )


def section_scale(world: World, args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    big = make_world(world.root / "scale", args.scale_players, seed=2)
    build_s = time.monotonic() - t0
    size_mb = os.path.getsize(big.store_url.removeprefix("sqlite://")) / 1e6
    figures = {"small": PerCall(), "big": PerCall()}
    apps, envs = {}, {}
    for name, w in (("small", world), ("big", big)):
        apps[name] = make_app(Settings.from_env(w.env))
        envs[name] = environs(w, sample=SCALE_SAMPLE)
    check = lambda body: body.startswith(b'{"success":true')  # noqa: E731
    for _ in range(3):
        for name in ("small", "big"):
            figures[name].figures += per_call_us(apps[name], envs[name], max(args.calls // 5, 1), 5, check)
    small, big_ = figures["small"], figures["big"]
    print(f"\n4. Scale: in-process cost per authentication, SQLite, {SCALE_SAMPLE:,} random players cycled "
          f"(the {args.scale_players:,}-player store: {size_mb:,.0f} MB, built in {build_s:.0f} s); "
          "3 alternating rounds of 5 runs\n")
    print("| players | µs per call, best | median | best vs 100k | median vs 100k |")
    print("|---|---|---|---|---|")
    for name, w in (("small", world), ("big", big)):
        f = figures[name]
        print(f"| {w.players:,} | {f.best:.2f} | {f.median:.2f} | {f.best / small.best:.3f} | "
              f"{f.median / small.median:.3f} |")
    print(f"\nTarget: {args.scale_players:,} within 1.2 x {world.players:,}: {big_.best / small.best:.3f} (best), "
          f"{big_.median / small.median:.3f} (median)")
    for app in apps.values():
        app.store.close()


def section_cold(world: World, args: argparse.Namespace) -> None:
    """In-process cost with the CPU caches emptied before each call, as gunicorn's own work empties them."""
    from benchmarks import bare, flask_app, plain_app

    envs = environs(world)
    db_path = world.store_url.removeprefix("sqlite://")
    authsvc = make_app(Settings.from_env(world.env))
    apps = {"bare": bare.application, "plain": plain_app.create_app(db_path, world.secret), "authsvc": authsvc,
            "flask": flask_app.create_app(db_path, world.secret)}
    sizes = {"8 MB": 8 << 20, "64 MB": 64 << 20}  # past this machine's L2 (1 MB/core); past its L3 (32 MB) too
    buffers = {label: bytearray(size) for label, size in sizes.items()}

    def start_response(status, headers, exc_info=None):
        return None

    print("\n6. In-process cost per call: hot (called in a loop), and with 8 MB or 64 MB of memory touched before "
          f"each call (as gunicorn's own work between two requests empties the caches); {args.cold_calls} calls, "
          "best of 3 runs\n")
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


def section_bodies(world: World, args: argparse.Namespace) -> None:
    """Each costly body against a plain form, the WSGI callable called directly; a fresh input per call."""
    from tests.hostile_bodies import curl_form, plain_form, worst_bodies

    app = make_app(Settings.from_env(world.env))
    uid = world.user_ids[0]
    params = {"user_id": str(uid), "game_auth_token": mint_token(world.secret, world.game_id, uid, 0),
              "api_key": world.api_key}
    cases = [("form: the three fields (the reference)", *plain_form(params)),
             ("multipart: the three fields, as curl -F sends them", *curl_form(params)), *worst_bodies(params)]

    def start_response(status, headers, exc_info=None):
        return None

    def environ(body: bytes, content_type: str) -> dict:
        env = {"REQUEST_METHOD": "POST", "PATH_INFO": PATH, "QUERY_STRING": "", "CONTENT_TYPE": content_type,
               "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
        wsgiref.util.setup_testing_defaults(env)
        return env

    answers = {}
    for label, body, content_type in cases:  # refuse to time a body the app does not answer as documented
        answer = json.loads(b"".join(app(environ(body, content_type), start_response)))
        success = label.endswith(("(the reference)", "curl -F sends them"))
        if answer.get("success") is not success or (not success and answer.get("error") not in (400, 403)):
            raise SystemExit(f"bench: {label!r} answered {answer}")
        answers[label] = "success" if success else f"{answer['error']}: {answer['error_description']}"
    calls = max(args.calls // 20, 20)
    figures = {label: PerCall() for label, _, _ in cases}
    for _ in range(3):  # alternate, like the other sections
        for label, body, content_type in cases:
            for _ in range(5):
                envs = [environ(body, content_type) for _ in range(calls)]
                t0 = time.perf_counter()
                for env in envs:
                    b"".join(app(env, start_response))
                figures[label].figures.append((time.perf_counter() - t0) / calls * 1e6)
    app.store.close()
    reference = figures[cases[0][0]].best
    print(f"\n7. Request bodies of at most 16 KiB: in-process cost per call (the WSGI callable called directly, "
          f"a POST with a fresh input each call); 3 alternating rounds of 5 runs of {calls} calls\n")
    print("| body | bytes | answer | µs per call, best | median | best vs plain form |")
    print("|---|---|---|---|---|---|")
    for label, body, _ in cases:
        f = figures[label]
        print(f"| {label} | {len(body):,} | {answers[label]} | {f.best:.1f} | {f.median:.1f} | "
              f"{f.best / reference:.1f} |")
    worst = max((label for label, _, _ in cases[1:]), key=lambda k: figures[k].best)
    print(f"\nTarget: the costliest body within 10 x a plain form: {figures[worst].best / reference:.1f} ({worst})")


def section_profile(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """py-spy samples one authsvc worker under wrk load: where a request's time goes, in situ."""
    py_spy = VENV_BIN / "py-spy"
    if not py_spy.exists():
        raise SystemExit("bench: the profile section needs py-spy (pip install -r benchmarks/requirements.txt)")
    port = free_port()
    raw = world.root / "profile.txt"
    with gunicorn(world, APPS["authsvc"], logs / "profile.log", bind=f"127.0.0.1:{port}",
                  args=core_gunicorn_args(args.workers)) as proc:
        wait_for(lambda: port_open(port), "gunicorn (profile)", proc)
        server = Server("authsvc", "endpoint", f"http://127.0.0.1:{port}", master=proc)
        check_answers(server, world)
        worker = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
        load = subprocess.Popen(["wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{args.duration}s",
                                 "-s", str(script), server.url + "/"], stdout=subprocess.DEVNULL)
        time.sleep(1)
        spy = subprocess.run([str(py_spy), "record", "-p", worker, "-d", str(max(args.duration - 2, 1)), "-r", "400",
                              "-f", "raw", "-o", str(raw), "--nonblocking"], capture_output=True, text=True)
        load.wait(args.duration + 60)
        if spy.returncode != 0 or not raw.exists():
            raise SystemExit(f"bench: py-spy failed: {spy.stderr.strip()[-500:]}")
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = {f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")" for f in stack.split(";") if " (" in f}
        total += int(count)
        for frame in frames:
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    print(f"\n5. Profile: py-spy, one of {args.workers} sync workers under wrk -c{args.connections}, {total} samples "
          "(time in the worker, on or off the CPU, idle waits excluded); share of samples that include each function\n")
    print("| function (file) | share |")
    print("|---|---|")
    # Leave out the frames every sample has (gunicorn's start-up and worker loop).
    mine = [(n, f) for f, n in inclusive.items() if ("authsvc/" in f or "gunicorn/" in f) and n < 0.9 * total]
    for n, frame in sorted(mine, reverse=True)[:args.profile_rows]:
        print(f"| {frame} | {100 * n / total:.1f}% |")


def versions() -> str:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    import importlib.metadata

    import gunicorn as gunicorn_pkg

    wrk_version = out(["wrk", "-v"]).split(" [")[0]
    nginx_version = subprocess.run([shutil.which("nginx") or "/usr/sbin/nginx", "-v"], capture_output=True,
                                   text=True).stderr.strip() if shutil.which("nginx") or os.path.exists(
                                       "/usr/sbin/nginx") else "nginx not installed"
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu}); "
            f"Python {platform.python_version()}, gunicorn {gunicorn_pkg.__version__}, SQLite {sqlite3.sqlite_version}, "
            f"Flask {importlib.metadata.version('flask')}, {wrk_version}, {nginx_version}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="core,nginx,postgres,scale,profile,cold,bodies",
                        help="comma-separated sections: core, nginx, postgres, scale, profile, cold, bodies "
                             "(default: all)")
    parser.add_argument("--players", type=int, default=100_000, help="players in the store (default 100,000)")
    parser.add_argument("--scale-players", type=int, default=10_000_000, help="players of the scale section's store")
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers in core and postgres (default 2)")
    parser.add_argument("--calls", type=int, default=20_000, help="in-process calls per round (default 20,000)")
    parser.add_argument("--pg", default=os.environ.get("AUTHSVC_BENCH_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="superuser URL of a PostgreSQL server; a temporary database is made and dropped")
    parser.add_argument("--cold-calls", type=int, default=300, help="calls per run of the cold section")
    parser.add_argument("--profile-rows", type=int, default=30, help="functions listed by the profile section")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (stores, logs)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - {"core", "nginx", "postgres", "scale", "profile", "cold", "bodies"}
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if any(s not in ("scale", "cold", "bodies") for s in sections) and not shutil.which("wrk"):
        raise SystemExit("bench: wrk is not installed (Debian/Ubuntu: apt-get install wrk)")

    root = Path(tempfile.mkdtemp(prefix="authsvc-bench-"))
    logs = root / "logs"
    logs.mkdir()
    try:
        print(f"# authsvc benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')}\n\n{versions()}\n")
        t0 = time.monotonic()
        world = make_world(root / "world", args.players)
        print(f"Store: SQLite, {args.players:,} players, built in {time.monotonic() - t0:.1f} s; "
              f"requests cycle through {SAMPLE} random players, all valid.", flush=True)
        script = write_wrk_script(world, root / "requests.lua")
        for section in sections:
            print(f"bench: section {section} ...", file=sys.stderr, flush=True)
            if section == "core":
                section_core(world, args, logs, script)
            elif section == "nginx":
                section_nginx(world, args, logs, script)
            elif section == "postgres":
                section_postgres(world, args, logs, script)
            elif section == "profile":
                section_profile(world, args, logs, script)
            elif section == "cold":
                section_cold(world, args)
            elif section == "bodies":
                section_bodies(world, args)
            else:
                section_scale(world, args)
            sys.stdout.flush()
    finally:
        if args.keep:
            print(f"\n(work directory kept: {root})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
