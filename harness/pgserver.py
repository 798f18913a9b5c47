"""Throwaway PostgreSQL servers, hot standbys, pgbouncers and heartbeat writers, for tests and
scripts/bench.

A server listens on a free loopback port only (no unix socket), keeps its data in a
temporary directory and is removed by ``destroy()``. PostgreSQL refuses to run
as root (nor does pgbouncer), so under root both run as the ``postgres`` (or
``nobody``) user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile

from harness.processes import free_port


def find_bin_dir() -> str | None:
    """The directory holding initdb and pg_ctl, or None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(directory, "pg_ctl"), os.X_OK):
            return directory
    return None


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")


class ThrowawayPostgres:
    """initdb + pg_ctl start/stop on 127.0.0.1:<free port>; superuser ``postgres``, trust auth.
    With ``netns`` (root only) every command runs in that network namespace and the server listens
    on ``address`` there, trusting its subnet (tests/system/test_store_network.py cuts the link to
    it). ``max_connections``: a small one shows connections left behind as refusals."""

    _started = False  # started once: its port is named by clients and standbys from then on

    def __init__(
        self,
        bin_dir: str,
        *,
        netns: str | None = None,
        address: str = "127.0.0.1",
        max_connections: int = 50,
    ):
        self.bin_dir = bin_dir
        self.max_connections = max_connections
        self.netns, self.address = netns, address
        self.user = _run_as()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="authsvc-pg-")
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "server.log")
        if self.user:
            os.chown(self.dir, pwd.getpwnam(self.user).pw_uid, -1)
        self._run(
            "initdb",
            "-D",
            self.data,
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        )
        if netns:
            with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
                f.write("host all all samenet trust\nhost replication all samenet trust\n")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        command, user = [os.path.join(self.bin_dir, program), *args], self.user
        if self.netns:
            command, user = (
                [
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    "runuser",
                    "-u",
                    user or "root",
                    "--",
                    *command,
                ],
                None,
            )
        result = subprocess.run(
            command, user=user, capture_output=True, text=True, timeout=60, cwd=self.dir
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()[-2000:]}"
            )

    def start(self) -> None:
        """Start the server; the log's last lines in the error if it does not. Its first start takes
        another free port when the one chosen was taken meanwhile (a test beside it bound it first);
        a restart keeps its port, which clients and standbys already name."""
        for attempt in range(3):
            options = (
                f"-p {self.port} -c listen_addresses={self.address} -c unix_socket_directories='' "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                f"-c max_connections={self.max_connections}"
            )
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    self.data,
                    "-l",
                    self.logfile,
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "30",
                    "start",
                )
            except RuntimeError as e:
                log = self._log_tail()
                if attempt < 2 and not self._started and not self.netns and "could not bind" in log:
                    self.port = free_port()
                    continue
                raise RuntimeError(f"{e}\n{log}") from None
            self._started = True
            return

    def _log_tail(self) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""

    def stop(self) -> None:
        """A fast shutdown: open connections are closed, as in a real restart."""
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "30", "stop")

    def postmaster_pid(self) -> int | None:
        """The server's main process (its backends are its children), from postmaster.pid."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        return os.path.exists(os.path.join(self.data, "postmaster.pid"))

    def destroy(self) -> None:
        try:
            if self.running():
                self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "30", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# What docs/scaling.md ("Reading from hot standbys") tells operators to give a standby: a WAL
# receiver that gives up on a silent primary after 10 s (default 60 s), a connect that gives up
# after 2 s (default: the kernel's, ~2 min) and a new one each second (default 5 s), so it
# reconnects within seconds of its link coming back.
STANDBY_CONNINFO = "connect_timeout=2 tcp_user_timeout=2000"
STANDBY_SETTINGS = "wal_receiver_timeout = '10s'\nwal_retrieve_retry_interval = '1s'\n"


class ThrowawayStandby(ThrowawayPostgres):
    """A hot standby of a running ThrowawayPostgres: ``pg_basebackup -R`` (streaming replication),
    with the replication timeouts docs/scaling.md recommends (STANDBY_CONNINFO,
    STANDBY_SETTINGS)."""

    def __init__(self, primary: ThrowawayPostgres):
        self.bin_dir = primary.bin_dir
        self.max_connections = primary.max_connections  # a hot standby needs at least the primary's
        self.netns, self.address = None, "127.0.0.1"
        self.user = primary.user
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="authsvc-pg-standby-")
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "server.log")
        if self.user:
            os.chown(self.dir, pwd.getpwnam(self.user).pw_uid, -1)
        self._run(
            "pg_basebackup",
            "-D",
            self.data,
            "-R",
            "-X",
            "stream",
            "--no-sync",
            "-d",
            f"host={primary.address} port={primary.port} user=postgres {STANDBY_CONNINFO}",
        )
        with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
            f.write(STANDBY_SETTINGS)


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None
    )


class ThrowawayPgbouncer:
    """pgbouncer on 127.0.0.1:<free port> in transaction mode, trust auth for ``role``, database
    ``authsvc`` pointing at ``dbname`` on a server's port (``host``: loopback); started at once
    (wait for ``port``).
    It runs as docs/stores.md ("pgbouncer") tells operators to: ``ignore_startup_parameters =
    options``, the web role's statement timeout and read-only default set on the role. ``repoint()``
    edits its ini and reloads it (SIGHUP), as an operator does in a failover; the failover timeouts
    are the ones docs/stores.md ("pgbouncer") recommends. Under root it runs as ``user`` (the
    server's): it refuses root."""

    def __init__(
        self,
        binary: str,
        role: str,
        target_port: int,
        user: str | None,
        *,
        dbname: str = "postgres",
        host: str = "127.0.0.1",
        pool_size: int = 2,
        max_client_conn: int = 20,
    ):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="authsvc-pgbouncer-")
        self.config = os.path.join(self.dir, "pgbouncer.ini")
        self.logfile = os.path.join(self.dir, "pgbouncer.log")
        self.role = role
        self.dbname, self.host = dbname, host
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        users = os.path.join(self.dir, "users.txt")
        with open(users, "w") as f:
            f.write(f'"{role}" ""\n')
        self._write(target_port)
        if user:
            uid = pwd.getpwnam(user).pw_uid
            for path in (self.dir, self.config, users):
                os.chown(path, uid, -1)
        self.proc = subprocess.Popen(
            [binary, self.config], user=user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    @property
    def url(self) -> str:
        return f"postgresql://{self.role}@127.0.0.1:{self.port}/authsvc"

    def _write(self, target_port: int) -> None:
        with open(self.config + ".new", "w") as f:
            f.write(
                "[databases]\n"
                f"authsvc = host={self.host} port={target_port} dbname={self.dbname}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
                f"pool_mode = transaction\ndefault_pool_size = {self.pool_size}\n"
                f"max_client_conn = {self.max_client_conn}\n"
                "ignore_startup_parameters = options\n"
                "server_connect_timeout = 2\nserver_login_retry = 1\nquery_wait_timeout = 2\n"
                "tcp_user_timeout = 3000\nquery_timeout = 3\n"
                f"logfile = {self.logfile}\n"
            )
        os.replace(
            self.config + ".new", self.config
        )  # keeps the owner set in __init__ (same user writes)

    def repoint(self, target_port: int) -> None:
        """The [databases] entry to another server, then a reload (what `systemctl reload pgbouncer`
        sends)."""
        stat = os.stat(self.config)
        self._write(target_port)
        os.chown(self.config, stat.st_uid, -1)
        self.proc.send_signal(signal.SIGHUP)

    def log(self) -> str:
        try:
            with open(self.logfile) as f:
                return f.read()
        except OSError:
            return ""

    def destroy(self) -> None:
        try:
            self.proc.terminate()
            self.proc.wait(10)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Heartbeat:
    """``authsvc heartbeat`` against the primary, as its systemd unit runs it (its log in a
    file)."""

    def __init__(self, primary_url: str, log_path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
        self.env.update(AUTHSVC_STORE=primary_url, AUTHSVC_TOKEN_SECRET_FILE="/nonexistent")
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "authsvc.cli.command", "heartbeat"],
                env=self.env,
                stdout=log,
                stderr=log,
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        self.process = None

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()
