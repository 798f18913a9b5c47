"""Start, wait for and stop the servers the tests and benchmarks run on loopback: gunicorn, nginx.

``start_gunicorn`` is the one way the suite and the bench start gunicorn; every
option a caller needs (config file, workers, preload, environment, bind) is a
parameter, so no caller builds its own command line. The one exception is the
deployment stack (tests/deploy_support.py), which runs gunicorn under
systemd-socket-activate exactly as the shipped units do. ``start_nginx`` starts
nginx for both.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 60.0, host: str = "127.0.0.1") -> None:
    """Until something listens on the port. A minute by default: a gunicorn start took over 15 s on
    a 2-core machine with a CI run and other jobs beside it; a process that never listens still
    fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def start_gunicorn(
    env: dict,
    *args: str,
    port: int | None = None,
    bind: str | None = None,
    app: str = "authsvc.wsgi:application",
    workers: int | None = 2,
    preload: bool = False,
    config: str | os.PathLike | None = None,
    inherit_env: bool = True,
    cwd: str | os.PathLike | None = None,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    gunicorn: str | os.PathLike | None = None,
    new_session: bool = False,
    prefix: tuple[str, ...] = (),
) -> subprocess.Popen:
    """gunicorn serving ``app`` on 127.0.0.1:``port`` (or ``bind``), with ``env`` over os.environ
    (``inherit_env=False``: over PATH only). ``workers=None`` leaves the count to the config file.
    Output is text on pipes unless given files. ``gunicorn`` names the executable (default:
    ``python -m gunicorn`` of this interpreter); ``new_session`` puts it in its own process group
    (for ``stop``); ``prefix`` runs it through commands that exec it (``nice -n 10``)."""
    command = [*prefix, *([str(gunicorn)] if gunicorn else [sys.executable, "-m", "gunicorn"])]
    if config is not None:
        command += ["--config", str(config)]
    if bind is not None or port is not None:
        command += ["--bind", bind or f"127.0.0.1:{port}"]
    if workers is not None:
        command += ["--workers", str(workers)]
    if preload:
        command.append("--preload")
    command += ["--no-control-socket", *args]
    if app:
        command.append(app)
    base = dict(os.environ) if inherit_env else {"PATH": os.environ["PATH"]}
    text = (
        stdout == subprocess.PIPE or stderr == subprocess.PIPE
    )  # str out of pipes, bytes into files
    return subprocess.Popen(
        command,
        env={**base, **env},
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        text=text,
        start_new_session=new_session,
    )


def start_nginx(nginx: str, prefix: Path, conf: Path, log: Path) -> subprocess.Popen:
    """nginx in the foreground with ``prefix`` and main config ``conf``, its own output in ``log``,
    in its own process group (for ``stop``)."""
    return subprocess.Popen(
        [nginx, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Stop a server we started in its own process group (start_new_session) and wait for it."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def nginx_main_conf(
    root: Path, logs: Path, site: Path, worker_processes: str = "1", worker_connections: int = 128
) -> str:
    """Debian's main nginx.conf, shortened: the http-level settings a machine has (TLSv1 and
    TLSv1.1 on, the combined access log) around the shipped site; temp paths in ``root``.
    The deployment tests use it with one worker, scripts/bench with Debian's ``worker_processes
    auto``."""
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(
        f"    {kind}_temp_path {root}/tmp/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""{user}worker_processes {worker_processes};
pid {root}/nginx.pid;
error_log {logs}/nginx-main-error.log;
events {{ worker_connections {worker_connections}; }}
http {{
    sendfile on;
    default_type application/octet-stream;
    ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3;
    ssl_prefer_server_ciphers on;
    access_log {logs}/nginx-default-access.log;
    gzip on;
{temp}
    include {site};
}}
"""
