"""A throwaway PostgreSQL server from the local binaries (initdb, pg_ctl), for tests.

It listens on a free loopback port only (no unix socket), keeps its data in a
temporary directory and is removed by ``destroy()``. PostgreSQL refuses to run
as root, so under root the server runs as the ``postgres`` (or ``nobody``) user.
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

from tests.support import free_port


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
    """initdb + pg_ctl start/stop on 127.0.0.1:<free port>; superuser ``postgres``, trust auth."""

    def __init__(self, bin_dir: str):
        self.bin_dir = bin_dir
        self.user = _run_as()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="authsvc-pg-")
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "server.log")
        if self.user:
            os.chown(self.dir, pwd.getpwnam(self.user).pw_uid, -1)
        self._run(
            "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--no-sync",
            "-E", "UTF8", "--locale=C", "--no-instructions",
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            [os.path.join(self.bin_dir, program), *args],
            user=self.user, capture_output=True, text=True, timeout=60, cwd=self.dir,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{program} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        self._run("pg_ctl", "-D", self.data, "-l", self.logfile, "-o", options, "-w", "-t", "30", "start")

    def stop(self) -> None:
        """A fast shutdown: open connections are closed, as in a real restart."""
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "30", "stop")

    def running(self) -> bool:
        return os.path.exists(os.path.join(self.data, "postmaster.pid"))

    def destroy(self) -> None:
        try:
            if self.running():
                self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "30", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class ThrowawayStandby(ThrowawayPostgres):
    """A hot standby of a running ThrowawayPostgres: ``pg_basebackup -R`` (streaming replication)."""

    def __init__(self, primary: ThrowawayPostgres):
        self.bin_dir = primary.bin_dir
        self.user = primary.user
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="authsvc-pg-standby-")
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "server.log")
        if self.user:
            os.chown(self.dir, pwd.getpwnam(self.user).pw_uid, -1)
        self._run(
            "pg_basebackup", "-D", self.data, "-R", "-X", "stream", "--no-sync",
            "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
        )


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None)


class ThrowawayPgbouncer:
    """pgbouncer on 127.0.0.1:<free port> in transaction mode, trust auth for ``role``, database
    ``authsvc`` pointing at a server's port; ``repoint()`` edits its ini and reloads it (SIGHUP), as an
    operator does in a failover (docs/operations.md, "PostgreSQL primary failover"). The failover
    timeouts are the ones that runbook recommends. Under root it runs as the server's user."""

    def __init__(self, binary: str, role: str, target_port: int, user: str | None):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="authsvc-pgbouncer-")
        self.config = os.path.join(self.dir, "pgbouncer.ini")
        self.logfile = os.path.join(self.dir, "pgbouncer.log")
        self.role = role
        users = os.path.join(self.dir, "users.txt")
        with open(users, "w") as f:
            f.write(f'"{role}" ""\n')
        self._write(target_port)
        if user:
            uid = pwd.getpwnam(user).pw_uid
            for path in (self.dir, self.config, users):
                os.chown(path, uid, -1)
        self.proc = subprocess.Popen([binary, self.config], user=user, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"postgresql://{self.role}@127.0.0.1:{self.port}/authsvc"

    def _write(self, target_port: int) -> None:
        with open(self.config + ".new", "w") as f:
            f.write(
                "[databases]\n"
                f"authsvc = host=127.0.0.1 port={target_port} dbname=postgres\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
                "pool_mode = transaction\ndefault_pool_size = 2\nmax_client_conn = 20\n"
                "ignore_startup_parameters = options\n"
                "server_connect_timeout = 2\nserver_login_retry = 1\nquery_wait_timeout = 2\n"
                f"logfile = {self.logfile}\n"
            )
        os.replace(self.config + ".new", self.config)  # keeps the owner set in __init__ (same user writes)

    def repoint(self, target_port: int) -> None:
        """The [databases] entry to another server, then a reload (what `systemctl reload pgbouncer` sends)."""
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
    """``authsvc heartbeat`` against the primary, as its systemd unit runs it (its log in a file)."""

    def __init__(self, primary_url: str, log_path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
        self.env.update(AUTHSVC_STORE=primary_url, AUTHSVC_TOKEN_SECRET_FILE="/nonexistent")
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "authsvc.cli", "heartbeat"], env=self.env, stdout=log, stderr=log
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        self.process = None

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()
