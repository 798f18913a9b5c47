"""Throwaway PostgreSQL servers, hot standbys and pgbouncers from the local binaries, for tests and scripts/bench.

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
import subprocess
import tempfile
import urllib.parse

from harness.processes import free_port, wait_for_port


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
    """pgbouncer on 127.0.0.1:<free port> in front of one database, ``pool_mode = transaction``, trust auth
    for ``users``. It needs what docs/stores.md ("pgbouncer") tells operators: ``ignore_startup_parameters
    = options``, the web role's statement timeout and read-only default set on the role."""

    def __init__(self, binary: str, server_url: str, users: list[str], *, database: str = "authsvc",
                 pool_size: int = 1, max_client_conn: int = 100):
        target = urllib.parse.urlsplit(server_url)
        self.binary = binary
        self.user = _run_as()
        self.port = free_port()
        self.database = database
        self.dir = tempfile.mkdtemp(prefix="authsvc-pgbouncer-")
        self.config = os.path.join(self.dir, "pgbouncer.ini")
        self.logfile = os.path.join(self.dir, "pgbouncer.log")
        self.proc: subprocess.Popen | None = None
        users_file = os.path.join(self.dir, "users.txt")
        with open(users_file, "w") as f:
            f.writelines(f'"{user}" ""\n' for user in users)
        with open(self.config, "w") as f:
            f.write(
                "[databases]\n"
                f"{database} = host={target.hostname} port={target.port or 5432} dbname={target.path.lstrip('/')}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {users_file}\n"
                f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = {max_client_conn}\n"
                "ignore_startup_parameters = options\n"
                f"logfile = {self.logfile}\n"
            )
        if self.user:
            uid = pwd.getpwnam(self.user).pw_uid
            for path in (self.dir, self.config, users_file):
                os.chown(path, uid, -1)

    def url(self, user: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, self.config], user=self.user, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def destroy(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(10)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
