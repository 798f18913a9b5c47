"""PostgreSQL backup and restore (docs/operations.md, section 8): ``pg_dump`` and ``pg_restore`` run
for the owner role, then the restored copy is changed as store/restore.py says.

The dump: custom format, no owner (the restoring role owns what it creates), without the webhooks'
rows and their deliveries (no webhook secret is in a backup, as in a SQLite one). The restore: one
transaction (psql's ``--single-transaction``) drops the owner's tables and functions and creates the
dump's, with the dump's grants on them but none on PostgreSQL's own functions (the owner may not
change those: privileges.sql does, once); then ``authsvc init``'s migrations and grants, then
store/restore.py's changes in one write. It refuses while another session is connected to the
database or the deliverer's lease is held and fresh: every authsvc process holds a session."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time

import psycopg
from psycopg import conninfo as pg_conninfo

from authsvc.errors import ConfigError, StoreLocked
from authsvc.store import ledger as restore_ledger
from authsvc.store.audit import Audit
from authsvc.store.postgres.store import PostgresStore
from authsvc.store.restore import Restored, apply
from authsvc.urls import redact_url

__all__ = ["backup", "restore"]

# Not in a backup: the webhooks (their secrets) and what hangs off them.
WEBHOOK_TABLES = ("webhooks", "deliveries", "delivery_attempts", "deliverer_lease")
TIMEOUT = 3600.0  # seconds a pg_dump, pg_restore or psql may take


def _client(url: str) -> tuple[str, dict[str, str]]:
    """libpq's connection string without the password, and the environment that carries it (never
    argv)."""
    try:
        params = {k: str(v) for k, v in pg_conninfo.conninfo_to_dict(url).items() if v is not None}
    except psycopg.ProgrammingError:
        raise ConfigError(
            f"AUTHSVC_STORE {redact_url(url)} is not a valid PostgreSQL URL"
        ) from None
    env = dict(os.environ)
    if "password" in params:
        env["PGPASSWORD"] = params.pop("password")
    return pg_conninfo.make_conninfo(**params), env


def _program(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"{name} is not on PATH: install PostgreSQL's client programs (Debian: "
            "postgresql-client)"
        )
    return found


def _run(argv: list[str], env: dict[str, str], what: str) -> str:
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what} took more than {TIMEOUT:g} s and was stopped") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise ConfigError(f"{what} failed: {lines[0] if lines else f'exit {done.returncode}'}")
    return done.stdout


def backup(url: str, path: str) -> None:
    """``pg_dump`` to a new file ``path`` (custom format, 0600)."""
    if os.path.exists(path):
        raise ConfigError(f"backup target {path} exists; give a new file name")
    conninfo, env = _client(url)
    argv = [
        _program("pg_dump"),
        "--format=custom",
        "--no-owner",
        "--file",
        path,
        "--dbname",
        conninfo,
    ]
    argv += [f"--exclude-table-data={table}" for table in WEBHOOK_TABLES]
    fd = os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
    )  # pg_dump writes into it: never open to others
    os.close(fd)
    try:
        _run(argv, env, "pg_dump")
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        raise


def _one(conn: psycopg.Connection, sql: str):
    """The first column of a query's one row."""
    row = conn.execute(sql).fetchone()
    return None if row is None else row[0]


def _check_alone(conn: psycopg.Connection) -> None:
    """StoreLocked if another client is connected to the database, or the deliverer's lease is
    fresh."""
    others = conn.execute(
        "SELECT coalesce(usename, '?'), count(*) FROM pg_stat_activity WHERE datname = "
        "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' GROUP "
        "BY 1 ORDER BY 1"
    ).fetchall()
    if others:
        who = ", ".join(f"{n} of {role}" for role, n in others)
        raise StoreLocked(
            f"other sessions are connected to the database ({who}): stop authsvc.socket, "
            "authsvc.service, authsvc-admin.socket, authsvc-admin.service, authsvc-deliver.service "
            "and authsvc-heartbeat.service on every host first (docs/operations.md section 8)"
        )
    if _one(conn, "SELECT to_regclass('deliverer_lease') IS NOT NULL"):
        row = conn.execute("SELECT holder, until_ms FROM deliverer_lease").fetchone()
        if row is not None and row[1] > time.time() * 1000:
            raise StoreLocked(
                "the webhook deliverer's lease is held: stop authsvc-deliver.service on every host "
                "first (docs/operations.md section 8)"
            )


def _live_facts(conn: psycopg.Connection, into: restore_ledger.Ledger) -> str:
    """The restore generation and deleted players the live database knows; the statements that drop
    the owner's objects (the first half of the restore's transaction)."""
    if _one(conn, "SELECT to_regclass('restore_generation') IS NOT NULL"):
        into.generation = max(
            into.generation,
            _one(conn, "SELECT coalesce(max(generation), 0) FROM restore_generation"),
        )
    if _one(conn, "SELECT to_regclass('deleted_players') IS NOT NULL"):
        for user_id, epoch in conn.execute("SELECT user_id, epoch FROM deleted_players"):
            into.add_deleted(user_id, epoch)
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class AS c JOIN pg_namespace AS "
            "n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND n.nspname = "
            "current_schema() AND pg_get_userbyid(c.relowner) = current_user"
        )
    ]
    functions = [
        row[0]
        for row in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = "
            "p.pronamespace WHERE n.nspname = current_schema() AND pg_get_userbyid(p.proowner) = "
            "current_user"
        )
    ]
    drops = [f"DROP TABLE IF EXISTS {', '.join(tables)} CASCADE;"] if tables else []
    drops += [f"DROP FUNCTION IF EXISTS {name} CASCADE;" for name in functions]
    return "\n".join(drops) + "\n"


def restore(
    dump: str, url: str, ledger_path: str | None, audit: Audit, settings=None
) -> tuple[Restored, bool]:
    """Replace the database's content by ``dump``'s and change it (store/restore.py); (what changed,
    True: the live database was read). Run as the owner role."""
    try:
        with open(dump, "rb") as f:
            if f.read(5) != b"PGDMP":
                raise ConfigError(
                    f"{dump} is not a pg_dump archive in custom format ('authsvc backup' makes one)"
                )
    except OSError as e:
        raise ConfigError(f"backup {dump} cannot be read: {e.strerror}") from None
    known = restore_ledger.read(ledger_path)
    conninfo, env = _client(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            _check_alone(conn)
            drops = _live_facts(conn, known)
    except psycopg.Error as e:
        raise ConfigError(
            f"postgresql store {redact_url(url)} cannot be read: {type(e).__name__}"
        ) from None
    # before the database changes: a later restore moves past this generation even if this one fails
    if ledger_path:
        restore_ledger.append_generation(ledger_path, known.generation + 1)
    contents = _run([_program("pg_restore"), "--list", dump], env, "pg_restore --list")
    keep = "".join(line + "\n" for line in contents.splitlines() if " ACL pg_catalog " not in line)
    with tempfile.TemporaryDirectory(prefix="authsvc-restore-") as work:
        listing, prelude, script = (
            os.path.join(work, name) for name in ("list", "drop.sql", "restore.sql")
        )
        for path, text in ((listing, keep), (prelude, drops)):
            with open(path, "w") as f:
                f.write(text)
        _run(
            [
                _program("pg_restore"),
                "--no-owner",
                f"--use-list={listing}",
                f"--file={script}",
                dump,
            ],
            env,
            "pg_restore",
        )
        _run(
            [
                _program("psql"),
                "-X",
                "-q",
                "--single-transaction",
                "-v",
                "ON_ERROR_STOP=1",
                "--dbname",
                conninfo,
                "-f",
                prelude,
                "-f",
                script,
            ],
            env,
            "the restore's transaction (psql)",
        )
    store = PostgresStore(url, readonly=False, settings=settings)
    try:
        store.migrate()
        with store.write(audit) as tx:
            done = apply(tx, known.generation, known.deleted)
    finally:
        store.close()
    if ledger_path and done.generation > known.generation + 1:
        restore_ledger.append_generation(ledger_path, done.generation)
    if done.erased:  # the deleted players' dead row versions (docs/stores.md, "Erasure")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "VACUUM (FULL) audit, audit_names, player_keys, deleted_players, players, events"
            )
    return done, True
