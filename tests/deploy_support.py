"""The shipped deployment, run for real on loopback: nginx + TLS in front of gunicorn.

``start_stack`` renders deploy/ with ``python -m authsvc.deployment`` (what
scripts/install runs), provisions a throwaway store and secret, starts gunicorn
under ``systemd-socket-activate`` (the socket activation and sd_notify path of
the systemd unit) and nginx with a Debian-like main config around the shipped
site. ``request`` is a small HTTP(S) client that dials 127.0.0.1 while sending
the real host name (SNI and Host).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import trustme

from harness.processes import (
    find_nginx,
    free_port,
    ipv6_loopback,
    nginx_main_conf,
    start_nginx,
    stop,
    wait_for_port,
)
from tests.support import skip_or_fail

REPO = Path(__file__).resolve().parent.parent
API_HOST = "api.authsvc.test"
LEGACY_HOST = "legacy.authsvc.test"
ADMIN_HOST = "admin.authsvc.test"
VENV_BIN = Path(sys.executable).parent


@dataclasses.dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


@dataclasses.dataclass
class Stack:
    root: Path
    https_port: int
    http_port: int
    ca: trustme.CA
    ca_file: Path
    game_id: int
    api_key: str
    other_api_key: str
    user_id: int
    username: str
    token: str
    token_secret: str
    env: dict  # points the admin command at the store and secret
    gunicorn: subprocess.Popen
    nginx: subprocess.Popen
    ready_message: str
    logs: Path
    metrics_port: int = 0  # the monitoring server (/metrics, /healthz, /readyz), loopback
    # start_stack(extra_app_hosts=N): more gunicorn instances ("app hosts") on loopback
    # TCP, after the unix socket in UPSTREAMS; their logs are gunicorn-<port>-*.log.
    app_hosts: list[tuple[str, subprocess.Popen]] = dataclasses.field(default_factory=list)
    # start_stack(admin=True): the admin API (gunicorn on its own unix socket) behind the
    # optional admin server (sites/authsvc-admin.conf) on admin_port; admin_token has every scope.
    admin_port: int = 0
    admin_gunicorn: subprocess.Popen | None = None
    admin_token: str = ""

    def client_context(self, **versions) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        for name, value in versions.items():
            setattr(ctx, name, value)
        return ctx

    def request(
        self,
        scheme: str,
        path: str,
        *,
        host: str | None = None,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict | None = None,
        source: str = "127.0.0.1",
        sni: str | None = None,
        context: ssl.SSLContext | None = None,
        address: str = "127.0.0.1",
        port: int | None = None,
    ) -> Answer:
        port = port or (self.https_port if scheme == "https" else self.http_port)
        host = host or (API_HOST if scheme == "https" else LEGACY_HOST)
        sock = socket.create_connection((address, port), timeout=10, source_address=(source, 0))
        try:
            if scheme == "https":
                sock = (context or self.client_context()).wrap_socket(
                    sock, server_hostname=sni or host
                )
            conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.sock = sock
            all_headers = {"Host": host, **(headers or {})}
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            return Answer(response.status, response.headers, response.read())
        finally:
            sock.close()

    def api_query(self, **overrides) -> str:
        params = {
            "user_id": str(self.user_id),
            "game_auth_token": self.token,
            "api_key": self.api_key,
        }
        params.update(overrides)
        return "/api/authenticate.json?" + "&".join(
            f"{k}={v}" for k, v in params.items() if v is not None
        )

    def log_texts(self) -> dict[str, str]:
        """Every log file nginx and gunicorn wrote, by name."""
        return {
            p.name: p.read_text(errors="replace")
            for p in sorted(self.logs.iterdir())
            if p.is_file()
        }

    def gunicorn_worker_pids(self) -> set[int]:
        children = Path(f"/proc/{self.gunicorn.pid}/task/{self.gunicorn.pid}/children")
        try:
            return {int(p) for p in children.read_text().split()}
        except OSError:
            return set()


def wait_for_log(stack, name: str, needles: list[str]) -> str:
    """The log's text once it holds every needle (access logs are written as requests end); at most
    5 s."""
    deadline = time.monotonic() + 5
    while True:
        text = (stack.logs / name).read_text()
        if all(n in text for n in needles):
            return text
        assert time.monotonic() < deadline, f"{needles} not in {name}"
        time.sleep(0.05)


def forty_client_headers(user_agent: str, accept: str) -> dict[str, str]:
    """40 headers a client might send, its own X-Forwarded-*, Forwarded and X-Request-Start among
    them: none of them may reach gunicorn through nginx."""
    headers = {f"X-Client-{i}": f"value {i}" for i in range(34)}
    headers.update(
        {
            "User-Agent": user_agent,
            "Accept": accept,
            "Cookie": "a=b",
            "Forwarded": "for=203.0.113.9",
            "X-Forwarded-Host": "evil.example",
            "X-Request-Start": "t=1",
        }
    )
    return headers


def _run(cmd: list[str], env: dict) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{cmd[:4]} failed: {done.stderr}"
    return done.stdout


def start_stack(
    root: Path,
    *,
    values: dict | None = None,
    worker_connections: int = 128,
    extra_app_hosts: int = 0,
    workers: int = 2,
    app_env: dict | None = None,
    app_host_env: dict | None = None,
    admin: bool = False,
    app: str = "authsvc.wsgi:create_app()",
) -> Stack:
    """The stack in ``root``; ``values`` override placeholder values, ``worker_connections``
    sizes nginx's main config (tests/integration/test_edge.py makes it small to reach exhaustion).
    ``extra_app_hosts`` more gunicorn instances serve the same store on 127.0.0.1 TCP
    ports (``AUTHSVC_BIND``), named after the unix socket in ``UPSTREAMS``; ``workers``
    is each gunicorn's AUTHSVC_WORKERS; ``app_env`` more of gunicorn's environment (settings), for
    every app host; ``app_host_env`` more environment for the TCP ones only. ``admin`` opts in to
    the admin server, as ``scripts/install --admin-host`` does: both sites included, the admin API
    served on its unix socket, only 127.0.0.1 allowed (127.0.0.2 is another address)."""
    nginx = find_nginx()
    if nginx is None:
        skip_or_fail("nginx is not installed (Debian: apt-get install nginx)")
    activate = shutil.which("systemd-socket-activate")
    if activate is None:
        skip_or_fail("systemd-socket-activate is not installed (Debian: apt-get install systemd)")

    logs, state, creds, tmp = root / "logs", root / "state", root / "credentials", root / "tmp"
    for d in (logs, state, creds, tmp, root / "home", root / "gunicorn-tmp", root / "acme"):
        d.mkdir(mode=0o700)

    # Throwaway secret and store, provisioned with the admin command.
    token_secret = secrets.token_hex(32)
    (creds / "token-secret").write_text(token_secret + "\n")
    (creds / "token-secret").chmod(0o600)
    admin_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AUTHSVC_STORE": f"sqlite://{state}/authsvc.db",
        "AUTHSVC_TOKEN_SECRET_FILE": str(creds / "token-secret"),
    }
    cli = [sys.executable, "-m", "authsvc.cli.command"]
    _run([*cli, "init"], admin_env)
    game = json.loads(_run([*cli, "game", "add", "Chess", "--json"], admin_env))
    other = json.loads(_run([*cli, "game", "add", "Go", "--json"], admin_env))
    _run([*cli, "player", "add", "4242", "alice"], admin_env)
    token = _run(
        [*cli, "token", "issue", "--game", str(game["game_id"]), "--user", "4242"], admin_env
    ).strip()

    # Certificates from a throwaway CA.
    ca = trustme.CA()
    cert = ca.issue_cert(API_HOST)
    cert.cert_chain_pems[0].write_to_path(str(root / "cert.pem"))
    cert.private_key_pem.write_to_path(str(root / "key.pem"))
    (root / "key.pem").chmod(0o600)
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    admin_cert = ca.issue_cert(ADMIN_HOST)
    admin_cert.cert_chain_pems[0].write_to_path(str(root / "admin-cert.pem"))
    admin_cert.private_key_pem.write_to_path(str(root / "admin-key.pem"))
    (root / "admin-key.pem").chmod(0o600)

    https_port, http_port, metrics_port, admin_port = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    )
    v6 = ipv6_loopback()
    listen = lambda port: f"127.0.0.1:{port}" + (f" [::1]:{port}" if v6 else "")  # noqa: E731
    rendered = root / "deploy"
    sock_path = root / "authsvc.sock"
    extra_ports = [free_port() for _ in range(extra_app_hosts)]
    upstreams = " ".join([f"unix:{sock_path}", *(f"127.0.0.1:{port}" for port in extra_ports)])
    values = {
        "API_HOST": API_HOST,
        "LEGACY_HOST": LEGACY_HOST,
        "HTTPS_LISTEN": listen(https_port),
        "HTTP_LISTEN": listen(http_port),
        "METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        "HTTPS_URL": f"https://{API_HOST}:{https_port}",
        "TLS_CERT": str(root / "cert.pem"),
        "TLS_KEY": str(root / "key.pem"),
        "SOCKET": str(sock_path),
        "NGINX_DIR": str(rendered / "nginx"),
        "NGINX_LOG_DIR": str(logs),
        "ACME_ROOT": str(root / "acme"),
        "RATE": "20r/s",
        "RATE_BURST": "50",
        "UPSTREAM_TIMEOUT": "2s",
        "ADMIN_HOST": ADMIN_HOST,
        "ADMIN_LISTEN": f"127.0.0.1:{admin_port}",
        "ADMIN_ALLOW": "127.0.0.1",
        "ADMIN_SOCKET": str(root / "authsvc-admin.sock"),
        "ADMIN_TLS_CERT": str(root / "admin-cert.pem"),
        "ADMIN_TLS_KEY": str(root / "admin-key.pem"),
        **({"UPSTREAMS": upstreams} if extra_app_hosts else {}),
        **(values or {}),
    }
    sets = [arg for name, value in values.items() for arg in ("--set", f"{name}={value}")]
    _run(
        [sys.executable, "-m", "authsvc.deployment", str(REPO / "deploy"), str(rendered), *sets],
        admin_env,
    )

    # gunicorn as systemd would start it: socket activation, credentials, state
    # directory, NOTIFY_SOCKET; HOME and TMPDIR empty dirs to prove nothing lands there.
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(root / "notify.sock"))
    notify.settimeout(1.0)
    service_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "TMPDIR": str(root / "gunicorn-tmp"),
        "AUTHSVC_CONFIG": str(rendered / "etc" / "authsvc.toml"),
        "AUTHSVC_STORE": f"sqlite://{state}/authsvc.db",
        "CREDENTIALS_DIRECTORY": str(creds),
        "STATE_DIRECTORY": str(state),
        "NOTIFY_SOCKET": str(root / "notify.sock"),
        "AUTHSVC_WORKERS": str(workers),
        "PYTHONDONTWRITEBYTECODE": "1",
        **({"PYTHONPATH": str(REPO)} if app != "authsvc.wsgi:create_app()" else {}),
        **(app_env or {}),
    }
    setenv = [arg for name, value in service_env.items() for arg in ("-E", f"{name}={value}")]
    gunicorn_cmd = [str(VENV_BIN / "gunicorn"), "--config", str(rendered / "gunicorn.conf.py"), app]
    gunicorn = subprocess.Popen(
        [activate, "-l", str(sock_path), *setenv, *gunicorn_cmd],
        stdout=open(logs / "gunicorn-access.log", "wb"),
        stderr=open(logs / "gunicorn-error.log", "wb"),
        env=service_env,
        cwd=root,
        start_new_session=True,
    )
    nginx_proc = None
    admin_gunicorn = None
    admin_token = ""
    app_hosts: list[tuple[str, subprocess.Popen]] = []
    try:
        if admin:
            # The admin API as authsvc-admin.service runs it: the shipped config, the admin app.
            admin_token = json.loads(
                _run(
                    [
                        *cli,
                        "api-token",
                        "add",
                        "deploy-test",
                        "--json",
                        *(
                            arg
                            for scope in (
                                "players:read",
                                "players:write",
                                "tokens:mint",
                                "games:read",
                                "audit:read",
                            )
                            for arg in ("--scope", scope)
                        ),
                    ],
                    admin_env,
                )
            )["token"]
            admin_env_service = {k: v for k, v in service_env.items() if k != "NOTIFY_SOCKET"}
            admin_env_service.update(
                {
                    "AUTHSVC_CONFIG": str(rendered / "etc" / "admin.toml"),  # as the unit's
                    "AUTHSVC_BIND": f"unix:{root / 'authsvc-admin.sock'}",
                    "AUTHSVC_WORKERS": "1",
                    "PROMETHEUS_MULTIPROC_DIR": str(root / "admin-metrics"),
                }
            )
            admin_gunicorn = subprocess.Popen(
                [
                    str(VENV_BIN / "gunicorn"),
                    "--config",
                    str(rendered / "gunicorn.conf.py"),
                    "authsvc.api.wsgi:create_app()",
                ],
                stdout=open(logs / "gunicorn-admin-access.log", "wb"),
                stderr=open(logs / "gunicorn-admin-error.log", "wb"),
                env=admin_env_service,
                cwd=root,
                start_new_session=True,
            )
        # Another app host: gunicorn bound to TCP by AUTHSVC_BIND, as on a machine
        # without nginx (docs/scaling.md), started directly (no socket activation).
        for port in extra_ports:
            host_env = {k: v for k, v in service_env.items() if k != "NOTIFY_SOCKET"}
            host_env["AUTHSVC_BIND"] = f"127.0.0.1:{port}"
            host_env.update(app_host_env or {})
            app_hosts.append(
                (
                    f"127.0.0.1:{port}",
                    subprocess.Popen(
                        gunicorn_cmd,
                        stdout=open(logs / f"gunicorn-{port}-access.log", "wb"),
                        stderr=open(logs / f"gunicorn-{port}-error.log", "wb"),
                        env=host_env,
                        cwd=root,
                        start_new_session=True,
                    ),
                )
            )
        for port in extra_ports:
            wait_for_port(port, timeout=30)
        # systemd-socket-activate starts gunicorn on the first connection, like a .socket unit.
        deadline = time.monotonic() + 10
        while not sock_path.exists():
            assert gunicorn.poll() is None and time.monotonic() < deadline, "socket never appeared"
            time.sleep(0.05)
        # The file appears at bind(), a moment before listen(): a connection then is refused.
        while True:
            try:
                with socket.socket(socket.AF_UNIX) as first:
                    first.connect(str(sock_path))
                break
            except ConnectionRefusedError:
                assert gunicorn.poll() is None and time.monotonic() < deadline, (
                    "socket never listened"
                )
                time.sleep(0.05)
        ready = ""
        deadline = time.monotonic() + 30
        while "READY=1" not in ready:
            assert gunicorn.poll() is None, (
                "gunicorn exited: " + (logs / "gunicorn-error.log").read_text()
            )
            assert time.monotonic() < deadline, "gunicorn never sent READY=1"
            try:
                ready += notify.recv(4096).decode()
            except TimeoutError:
                pass
        notify.close()

        conf = root / "nginx.conf"
        # Opting in to the admin server links its file beside the site's, as scripts/install does.
        site = rendered / "nginx" / "sites" / ("*.conf" if admin else "authsvc.conf")
        conf.write_text(nginx_main_conf(root, logs, site, worker_connections=worker_connections))
        check = subprocess.run(
            [nginx, "-t", "-q", "-p", str(root), "-c", str(conf)], capture_output=True, text=True
        )
        assert check.returncode == 0, f"nginx -t: {check.stderr}"
        nginx_proc = start_nginx(nginx, root, conf, logs / "nginx-stdout.log")
        wait_for_port(https_port)
        wait_for_port(http_port)
        if admin:
            wait_for_port(admin_port)
            deadline = time.monotonic() + 30
            while not (root / "authsvc-admin.sock").exists():
                assert admin_gunicorn.poll() is None, (
                    logs / "gunicorn-admin-error.log"
                ).read_text()
                assert time.monotonic() < deadline, "the admin API's socket never appeared"
                time.sleep(0.05)
    except BaseException:
        stop(nginx_proc)
        stop(gunicorn)
        stop(admin_gunicorn)
        for _, proc in app_hosts:
            stop(proc)
        raise
    return Stack(
        root=root,
        https_port=https_port,
        http_port=http_port,
        ca=ca,
        ca_file=root / "ca.pem",
        game_id=game["game_id"],
        api_key=game["api_key"],
        other_api_key=other["api_key"],
        user_id=4242,
        username="alice",
        token=token,
        token_secret=token_secret,
        env=admin_env,
        gunicorn=gunicorn,
        nginx=nginx_proc,
        ready_message=ready,
        logs=logs,
        metrics_port=metrics_port,
        app_hosts=app_hosts,
        admin_port=admin_port if admin else 0,
        admin_gunicorn=admin_gunicorn,
        admin_token=admin_token,
    )
