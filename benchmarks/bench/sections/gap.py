"""Section gap: the instructions one worker executes per request, under callgrind, configuration by configuration.

CPU time per request moves by several percent between runs on a shared machine;
the user-space instructions a worker executes per request do not (three runs of
the bare app: 919,265 / 920,580 / 920,825). Each row is one gunicorn worker under
``valgrind --tool=callgrind``, sent ``--gap-warm`` then ``--gap-requests``
sequential requests; callgrind dumps its counts when the first and the last of
those requests end (a post_request hook calls a marker function), so a row counts
exactly those requests: the worker's Python, gunicorn, SQLite, OpenSSL, libc;
not the kernel. Rows differ in one thing, so their differences say what each
thing costs (BENCHMARKS.md, "The shipped topology's gap").
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench.sections.nginx import nginx_in_front
from benchmarks.bench.serve import LEGACY_HOST, port_open, unix_socket_open
from benchmarks.bench.world import APPS, REPO, VENV_BIN, World
from harness.processes import free_port, stop

NO_ACCESS_LOG = "accesslog = None\nlogconfig_dict['loggers']['gunicorn.access']['level'] = 'WARNING'\n"
SHIPPED, CORE = "shipped", "core"  # behind nginx with gunicorn.conf.py; section 1's flags over TCP
CONFIGS = [
    # label, topology, app, environment, lines added to gunicorn.conf.py
    ("bare", SHIPPED, APPS["bare"], {}, ""),
    ("bare, with authsvc's 5 response headers", SHIPPED, "benchmarks.variants:bare_with_authsvc_headers", {}, ""),
    ("authsvc", SHIPPED, APPS["authsvc"], {}, ""),
    ("authsvc, auth line off (AUTHSVC_LOG_LEVEL=WARNING)", SHIPPED, APPS["authsvc"], {"AUTHSVC_LOG_LEVEL": "WARNING"}, ""),
    # The shipped authsvc.toml's record: nginx's line only (BENCHMARKS.md, "One record per request").
    ("authsvc, one record at the edge (access_record = edge)", SHIPPED, APPS["authsvc"],
     {"AUTHSVC_ACCESS_RECORD": "edge"}, ""),
    ("authsvc, metrics off", SHIPPED, "benchmarks.variants:authsvc_without_metrics", {}, ""),
    ("authsvc, auth line and metrics off", SHIPPED, "benchmarks.variants:authsvc_without_metrics",
     {"AUTHSVC_LOG_LEVEL": "WARNING"}, ""),
    ("bare, no access log", SHIPPED, APPS["bare"], {}, NO_ACCESS_LOG),
    ("bare, section 1's flags", CORE, APPS["bare"], {}, ""),
    ("bare with authsvc's headers, section 1's flags", CORE, "benchmarks.variants:bare_with_authsvc_headers", {}, ""),
    ("authsvc, section 1's flags", CORE, APPS["authsvc"], {}, ""),
    ("authsvc, metrics off, section 1's flags", CORE, "benchmarks.variants:authsvc_without_metrics", {}, ""),
]
MARKER = """
import binascii as _binascii
_served = [0]


def post_request(worker, req, environ, resp):
    # scripts/bench's gap section: callgrind dumps its counts at each call of crc_hqx.
    _served[0] += 1
    if _served[0] in ({first}, {last}):
        _binascii.crc_hqx(b"", 0)
"""


def drive(port: int, paths: list[str], count: int, host: str | None) -> None:
    """``count`` requests, one at a time, on one keep-alive connection (to nginx) or one each (to gunicorn)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        for i in range(count):
            conn.request("GET", paths[i % len(paths)], headers={"Host": host} if host else {})
            response = conn.getresponse()
            body = response.read()
            if response.status != 200 or not body.startswith(b'{"success":true,'):
                raise SystemExit(f"bench: gap: answered {response.status} {body[:200]!r}")
    finally:
        conn.close()


def instructions(world: World, args: argparse.Namespace, root: Path, http_port: int, sock: Path,
                 config: tuple) -> float:
    label, topology, app, env, extra = config
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    conf = root / f"{slug}.conf.py"
    marker = MARKER.format(first=args.gap_warm, last=args.gap_warm + args.gap_requests)
    command = [str(VENV_BIN / "python"), "-m", "gunicorn", "--no-control-socket", "--config", str(conf)]
    environ = {**os.environ, **world.env, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0", **env}
    if topology == SHIPPED:
        shipped = REPO / "deploy" / "gunicorn.conf.py"
        conf.write_text(f"__file__ = {str(shipped)!r}\nexec(compile(open(__file__).read(), __file__, 'exec'))\n"
                        f"timeout = 600\n{extra}{marker}")
        environ.update(AUTHSVC_BIND=f"unix:{sock}", AUTHSVC_WORKERS="1", STATE_DIRECTORY=str(root))
        port, host, ready = http_port, LEGACY_HOST, lambda: unix_socket_open(sock)
    else:
        conf.write_text(f"timeout = 600\n{marker}")
        port, host = free_port(), None
        command += ["--workers", "1", "--worker-class", "sync", "--preload", "--log-level", "warning",
                    "--bind", f"127.0.0.1:{port}"]
        ready = lambda: port_open(port)  # noqa: E731
    out = root / f"{slug}.%p.callgrind"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-before=binascii_crc_hqx*",
               *command, app]
    with (root / f"{slug}.log").open("wb") as log:
        proc = subprocess.Popen(command, env=environ, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench: gap: gunicorn ({label}) did not start; see {root / (slug + '.log')}")
            time.sleep(0.2)
        drive(port, world.paths(), args.gap_warm + args.gap_requests, host)
        worker = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
    finally:
        stop(proc, timeout=120)
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
    dump = Path(str(out).replace("%p", worker) + ".2")  # from the first marker to the second
    found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
    if not found:
        raise SystemExit(f"bench: gap: no counts in {dump}")
    return int(found.group(1)) / args.gap_requests


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    if not shutil.which("valgrind"):
        raise SystemExit("bench: the gap section needs valgrind (Debian: apt-get install valgrind)")
    root = world.root / "gap"
    root.mkdir(exist_ok=True)
    sock = root / "authsvc.sock"
    rows: dict[str, float] = {}
    with nginx_in_front(world, root / "nginx", sock) as (_, http_port, _proc):
        for config in CONFIGS:
            rows[config[0]] = instructions(world, args, root, http_port, sock, config)
            print(f"  gap: {config[0]:<52} {rows[config[0]]:12,.0f} instructions/request", file=sys.stderr)
    print(f"\n2b. The shipped topology's gap: instructions per request of one worker under callgrind "
          f"({args.gap_requests} sequential requests after {args.gap_warm}; user space only)\n")
    print("| configuration | instructions per request | vs bare of its topology |")
    print("|---|---|---|")
    for label, topology, *_ in CONFIGS:
        bare = rows["bare" if topology == SHIPPED else "bare, section 1's flags"]
        print(f"| {label} | {rows[label]:,.0f} | {rows[label] / bare:.3f} |")
    r, headers = rows, rows["bare, with authsvc's 5 response headers"]
    print("\nWhat authsvc adds to the bare app behind nginx, by difference of rows: "
          f"{r['authsvc'] - r['bare']:,.0f} instructions; the auth line "
          f"{r['authsvc'] - r['authsvc, auth line off (AUTHSVC_LOG_LEVEL=WARNING)']:,.0f}, metrics "
          f"{r['authsvc'] - r['authsvc, metrics off']:,.0f}, gunicorn's work on 3 more response headers "
          f"{headers - r['bare']:,.0f}, the rest (the app's own work) "
          f"{r['authsvc, auth line and metrics off'] - headers:,.0f}. "
          f"gunicorn's access log (both apps): {r['bare'] - r['bare, no access log']:,.0f}.")
