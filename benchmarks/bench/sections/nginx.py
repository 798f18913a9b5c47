"""Section nginx: the shipped nginx site in front of the shipped gunicorn.conf.py and authsvc.toml
(access_record = "edge": nginx's line the one record), sync against gthread."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from authsvc.settings import read_settings
from benchmarks.bench.serve import (
    API_HOST,
    LEGACY_HOST,
    Row,
    Server,
    gunicorn,
    measure,
    port_open,
    print_table,
    unix_socket_open,
    wait_for,
)
from benchmarks.bench.world import APPS, REPO, SHIPPED_ENV, World
from harness.processes import (
    find_nginx,
    free_port,
    ipv6_loopback,
    nginx_main_conf,
    start_nginx,
    stop,
)


@contextlib.contextmanager
def nginx_in_front(
    world: World,
    root: Path,
    sock: Path,
    *,
    overrides: dict[str, str] | None = None,
    worker_connections: int = 1024,
    worker_processes: str = "auto",
    edit: Callable[[Path], None] | None = None,
) -> Iterator[tuple[int, int, subprocess.Popen]]:
    """The shipped nginx site rendered as scripts/install renders it, its rate, per-address and
    per-app-host limits out of the way (a throughput measurement); ``overrides`` replace placeholder
    values (the storm section's UPSTREAM_MAX_CONNS); ``edit`` is called with ``root`` once the files
    are rendered (the storm section's reference site, the gap section's variants of the proxy
    snippet); ``worker_processes`` for nginx.conf (the storm section pins nginx to some CPUs:
    nginx's "auto" counts them all)."""
    import trustme

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
        "API_HOST": API_HOST,
        "LEGACY_HOST": LEGACY_HOST,
        "HTTPS_LISTEN": https_listen,
        "HTTP_LISTEN": f"127.0.0.1:{http_port}",
        "METRICS_LISTEN": f"127.0.0.1:{free_port()}",  # the monitoring server, unused here
        "HTTPS_URL": f"https://{API_HOST}:{https_port}",
        "TLS_CERT": str(root / "cert.pem"),
        "TLS_KEY": str(root / "key.pem"),
        "SOCKET": str(sock),
        "NGINX_DIR": str(root / "deploy" / "nginx"),
        "NGINX_LOG_DIR": str(root / "logs"),
        "ACME_ROOT": str(root / "acme"),
        "RATE": "1000000r/s",
        "RATE_BURST": "100000",
        "CONN_LIMIT": "65535",  # throughput, not the limiters (nginx: < 65536)
        # nor the per-app-host limit (0: none; the storm section sets its own)
        "UPSTREAM_MAX_CONNS": "0",
        # As scripts/install renders it from the shipped authsvc.toml: its access_record (edge: no
        # forwarded headers).
        "ACCESS_RECORD": str(read_settings(SHIPPED_ENV)["access_record"]),
        **(overrides or {}),
    }
    sets = [a for name, value in values.items() for a in ("--set", f"{name}={value}")]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "authsvc.deployment",
            str(REPO / "deploy"),
            str(root / "deploy"),
            *sets,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
    )
    if edit is not None:
        edit(root)
    conf = root / "nginx.conf"
    site = root / "deploy" / "nginx" / "sites" / "authsvc.conf"
    conf.write_text(
        nginx_main_conf(
            root,
            root / "logs",
            site,
            worker_processes=worker_processes,
            worker_connections=worker_connections,
        )
    )
    proc = start_nginx(nginx, root, conf, root / "logs" / "nginx.out")
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


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """One nginx; the gunicorn configurations in turn behind it on one unix socket, each round."""
    root = world.root / "nginx"
    sock = root / "authsvc.sock"
    rows: dict[str, Row] = {}
    https_rows: dict[str, Row] = {}
    with nginx_in_front(world, root, sock) as (https_port, http_port, _):
        for _round in range(args.rounds):
            for label, kind, worker_class, workers, threads in NGINX_CONFIGS:
                env = {
                    "AUTHSVC_BIND": f"unix:{sock}",
                    "AUTHSVC_WORKER_CLASS": worker_class,
                    "AUTHSVC_WORKERS": str(workers),
                    "AUTHSVC_THREADS": str(threads),
                    "STATE_DIRECTORY": str(world.root),
                    **SHIPPED_ENV,
                }
                args_ = ("--config", str(REPO / "deploy" / "gunicorn.conf.py"))
                with gunicorn(
                    world,
                    APPS[kind],
                    logs / f"nginx-{kind}-{worker_class}-{workers}.log",
                    bind=f"unix:{sock}",
                    args=args_,
                    env=env,
                ) as proc:
                    wait_for(lambda: unix_socket_open(sock), f"gunicorn ({label})", proc)
                    kind_ = "bare" if kind == "bare" else "endpoint"
                    http = Server(
                        label, kind_, f"http://127.0.0.1:{http_port}", host=LEGACY_HOST, master=proc
                    )
                    https = Server(
                        label,
                        kind_,
                        f"https://{API_HOST}:{https_port}",
                        ca_file=str(root / "ca.pem"),
                        master=proc,
                    )
                    row_http, row_https = measure([http, https], world, script, args, rounds=1)
                rows.setdefault(label, Row(http)).runs += row_http.runs
                https_rows.setdefault(label, Row(https)).runs += row_https.runs
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()
    rows, https_rows = list(rows.values()), list(https_rows.values())
    print_table(
        "2. Through the shipped nginx site (unix socket, upstream keep-alive), gunicorn.conf.py "
        "and authsvc.toml (access_record = edge: nginx's line the one record), legacy plain-HTTP "
        f"host, wrk -t{args.threads} -c{args.connections} -d{args.duration}s",
        rows,
        rows[0],
    )
    print_table(
        "   The same on the HTTPS host (TLS 1.3, connections kept alive by wrk)",
        https_rows,
        https_rows[0],
    )
