"""The PostgreSQL store's read path: what the web process runs (the admin side:
store/postgres/store.py).

The web process connects as a read-only role (docs/stores.md): one persistent
autocommit connection per thread of each worker process, opened lazily after
fork, with connect and statement timeouts; the credentials query is one round
trip: a server-side prepared statement, or an unnamed one behind pgbouncer. Any
failure on that path raises StoreUnavailable (HTTP 503) and drops a broken
connection, so the next request reconnects by itself. Every wait for the server
has a deadline of the app's own (a silent network is noticed by no timeout of
the server's or the kernel's), and after a connect or a reply that timed out the
process answers 503 at once for a while instead of queueing requests behind the
next wait (docs/stores.md, "Outages").

Only this module and store/postgres/store.py import psycopg (the ``authsvc[postgres]`` extra).
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.pq import DiagnosticField, ExecStatus

from authsvc.errors import ConfigError, StoreUnavailable, StoreUnreachable
from authsvc.loglines import LogThrottle
from authsvc.store.base import Credentials, Game, Reader
from authsvc.store.common import (
    GAMES_SQL,
    KEYS_SQL,
    ThreadConnections,
    check_schema,
    select_games,
    select_token_secrets,
)
from authsvc.urls import MASK, SECRET_PARAMS, redact_url

log = logging.getLogger("authsvc.store")

READER_ROLE = "authsvc_reader"
# len(postgres.MIGRATIONS): the version this release reads (a newer one: common.check_schema)
SCHEMA_VERSION = 14
COLLATE_C = (
    ' COLLATE "C"'  # key digests in SQLite's (byte) order, whatever the database's collation
)

# SQLite's query (store/sqlite/reader.py): one row always, every lookup made whether or not
# the key and the player exist, so the time of an answer tells neither. No key: game_id NULL.
# A missing player reads as a placeholder username (decoded like a real one) and epoch 0;
# its ``enabled`` is NULL, which is how the reader tells it is missing. A key's expiry in unix
# milliseconds: the earlier of expires_at_ms and the whole seconds the previous release writes.
CREDENTIALS_SQL = """
SELECT k.game_id, g.enabled, least(k.expires_at_ms, k.expires_at * 1000),
       coalesce(p.username, 'no-such-player'), coalesce(p.epoch, 0), p.enabled
FROM (SELECT %s AS user_id, %s AS digest) AS q
LEFT JOIN players AS p ON p.user_id = q.user_id
LEFT JOIN api_keys AS k ON k.digest = q.digest
LEFT JOIN games AS g ON g.id = coalesce(k.game_id, 0)
"""

# The same query for libpq's own placeholders, prepared once per web connection.
CREDENTIALS_STATEMENT = b"authsvc_credentials"
CREDENTIALS_SQL_PQ = (
    CREDENTIALS_SQL.replace("%s", "$1::bigint", 1).replace("%s", "$2::text", 1).encode()
)

# On a hot standby the same row also says how old its proof of freshness is (docs/stores.md, "Hot
# standby"): milliseconds since the primary's time in the heartbeat row this query's snapshot sees
# (NULL: no row), 0 once the server is no longer in recovery (promoted: it is the primary). A
# connection's cached standby flag may be stale after a failover, or behind a pooler that was
# repointed: there the check runs on every authentication, and a server no longer in recovery
# passes.
STANDBY_STATEMENT = b"authsvc_credentials_standby"
STANDBY_SQL_PQ = CREDENTIALS_SQL_PQ.replace(
    b"p.enabled\n",
    b"p.enabled, CASE WHEN pg_is_in_recovery() THEN (SELECT ceil(1000 * extract(epoch FROM "
    b"clock_timestamp() - h.at))::bigint FROM authsvc_heartbeat AS h WHERE h.id = 1) ELSE 0 END\n",
    1,
)
STALE_WARNING_INTERVAL = 10.0  # seconds between two "standby too far behind" lines of one process
# The smallest AUTHSVC_MAX_STALENESS a web process on a hot standby starts with: a healthy standby's
# heartbeat is up to 0.2 s old (authsvc heartbeat's interval) plus the replication delay, so a
# smaller bound would answer 503 to every authentication, or to most (docs/stores.md, "Hot
# standby").
STANDBY_MIN_STALENESS = 0.5
FAILURE_WARNING_INTERVAL = (
    10.0  # seconds between two "postgresql store unavailable" lines of one process
)


class ReplyTimeout(psycopg.OperationalError):
    """No reply within AUTHSVC_PG_REPLY_TIMEOUT: the connection is closed, never reused."""


def _timed_out(error: psycopg.Error) -> bool:
    """Whether the store failed by not answering in time (a connect or a reply), not by refusing."""
    return isinstance(error, (ReplyTimeout, psycopg.errors.ConnectionTimeout))


def _raise_unless(result, status: ExecStatus) -> None:
    """Raise the psycopg error a libpq result carries (by its SQLSTATE), unless it has
    ``status``."""
    if result.status == status:
        return
    sqlstate = result.error_field(DiagnosticField.SQLSTATE)
    try:
        error_class = (
            psycopg.errors.lookup(sqlstate.decode()) if sqlstate else psycopg.OperationalError
        )
    except KeyError:
        error_class = psycopg.DatabaseError
    raise error_class(result.error_message.decode("utf-8", "replace").strip())


def _reason(error: BaseException, secrets: tuple[str, ...]) -> str:
    """psycopg's message on one line, with the URL's secrets (password, sslpassword, ...)
    masked should libpq ever echo them."""
    text = " ".join(str(error).split()) or type(error).__name__
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


# A server that answers the connection with one of these FATAL errors is busy, not misconfigured.
_TRANSIENT_REFUSALS = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "too many clients already",
    "remaining connection slots are reserved",
)


def _unreachable(error: psycopg.Error) -> bool:
    """Whether a failed connection is an outage (nothing answered, or the server is starting,
    stopping or full) rather than the settings' fault (the server refused the role, password or
    database). libpq gives no SQLSTATE for a refused connection, only the server's message: a server
    that sends its messages in another language than English is read as refusing for good (fatal, as
    before)."""
    text = str(error)
    return "FATAL:" not in text or any(refusal in text for refusal in _TRANSIENT_REFUSALS)


class PostgresReader(ThreadConnections, Reader):
    """Connections, the credentials read path and the start-up check; PostgresStore adds the admin
    side."""

    def __init__(self, url: str, *, readonly: bool, settings=None):
        super().__init__()
        self.url = url
        self.readonly = readonly
        try:
            parsed = pg_conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            raise ConfigError(
                f"AUTHSVC_STORE {redact_url(url)} is not a valid PostgreSQL URL"
            ) from None
        params = {name: str(value) for name, value in parsed.items() if value is not None}
        self._secrets = tuple(
            value for name, value in params.items() if name in SECRET_PARAMS and value
        )
        self._max_lag_ms = round(1000 * getattr(settings, "max_staleness", 1.0))
        self._stale_logged = (False, -math.inf)  # (heartbeat row missing, when) of the last warning
        connect_timeout = getattr(settings, "pg_connect_timeout", 2.0)
        statement_timeout = getattr(settings, "pg_statement_timeout", 2.0)
        self._reply_timeout = getattr(settings, "pg_reply_timeout", 3.0)
        self._retry_after = getattr(settings, "pg_retry_after", 2.0)
        self._retry_at = (
            -math.inf
        )  # time.monotonic() before which the store is not tried (a process's own)
        self._failures = LogThrottle(FAILURE_WARNING_INTERVAL)
        # libpq takes whole seconds (and treats 1 as 2); never wait forever.
        params["connect_timeout"] = str(max(1, math.ceil(connect_timeout)))
        params.setdefault("application_name", "authsvc-web" if readonly else "authsvc-admin")
        params["client_encoding"] = "UTF8"  # _credentials_row decodes text results itself
        if readonly:
            # The web role may only SELECT anyway; read-only transactions are a second fence.
            # The statement timeout bounds a slow server; tcp_user_timeout a dead network.
            ms = max(1, round(statement_timeout * 1000))
            options = f"-c statement_timeout={ms} -c default_transaction_read_only=on"
            params["options"] = (params.get("options", "") + " " + options).strip()
            params.setdefault("tcp_user_timeout", str(ms + 1000))
        self._conninfo = pg_conninfo.make_conninfo(**params)

    # -- connections --------------------------------------------------------------
    def _connect(self) -> psycopg.Connection:
        """A new connection. libpq's connect timeout applies to each address of the host name (and
        each host of a list) in turn: N addresses that do not answer wait N x the timeout
        (docs/stores.md)."""
        return psycopg.connect(self._conninfo, autocommit=True)

    def _conn(self) -> psycopg.Connection:
        """This thread's connection, opened on first use and again after a failure (and a fork:
        common.py)."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or conn.closed:
            local.conn, local.prepared = None, False
            conn = self._connect()
            try:
                local.pooled, local.standby = self._backend(conn)
            except BaseException:
                conn.close()
                raise
            local.conn = conn
        return conn

    def _backend(self, conn: psycopg.Connection) -> tuple[bool, bool]:
        """Whether a pooler stands in between, and whether the server is a hot standby (in
        recovery). Whether a connection pooler (pgbouncer) stands between us and the server: the
        backend that answers a query is not the one whose key the startup returned. Through a pooler
        in transaction mode each transaction may run on another server connection, where a named
        statement prepared on this one does not exist (or another client's does): the query is then
        sent unnamed."""
        pgconn = conn.pgconn
        pgconn.send_query(b"SELECT pg_backend_pid(), pg_is_in_recovery()")
        result = self._reply(pgconn)
        _raise_unless(result, ExecStatus.TUPLES_OK)
        pid, standby = result.get_value(0, 0), result.get_value(0, 1)
        return pid is None or int(pid) != pgconn.backend_pid, standby == b"t"

    def _reply(self, pgconn):
        """The result of the query just sent (libpq's non-blocking send), waiting for the socket at
        most AUTHSVC_PG_REPLY_TIMEOUT in all: a network that went silent under an open connection (a
        blackhole behind pgbouncer, heavy loss) acknowledges nothing the kernel could time out, and
        the server's statement timeout never starts on a query that did not arrive. ReplyTimeout
        otherwise."""
        deadline = time.monotonic() + self._reply_timeout
        socket = pgconn.socket
        while pgconn.flush():  # 1 while some of the query is still to be sent
            self._wait(socket, select.POLLOUT, deadline)
        result = None
        while True:
            while not pgconn.is_busy():
                following = pgconn.get_result()
                if following is None:
                    if result is None:
                        raise psycopg.OperationalError("the server sent no result")
                    return result
                if result is None:  # one statement: one result (then None)
                    result = following
            self._wait(socket, select.POLLIN, deadline)
            pgconn.consume_input()

    def _wait(self, socket: int, events: int, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        poll = select.poll()
        poll.register(socket, events)
        if remaining <= 0 or not poll.poll(remaining * 1000):
            raise ReplyTimeout(f"no reply from the server within {self._reply_timeout:g} s")

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local = threading.local()

    def close(self) -> None:
        self._drop()

    # -- read path ------------------------------------------------------------------
    def credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        if (
            time.monotonic() < self._retry_at
        ):  # the store just timed out: 503 at once (docs/stores.md)
            raise StoreUnavailable(
                "postgresql store unavailable: retrying after AUTHSVC_PG_RETRY_AFTER"
            )
        for attempt in (1, 2):
            try:
                fresh = getattr(self._local, "conn", None) is None
                row = self._credentials_row(self._conn(), key_digest, user_id)
                break
            except psycopg.Error as e:
                conn = getattr(self._local, "conn", None)
                timed_out = _timed_out(e)
                broken = conn is None or conn.broken or conn.closed or timed_out
                if broken:
                    # a connection that timed out may still get its late reply: never reused
                    self._drop()
                if timed_out:
                    self._retry_at = time.monotonic() + self._retry_after
                # A connection that went stale while idle (server restarted) gets one fresh retry.
                if attempt == 2 or fresh or not broken or timed_out:
                    self._log_failure(e)
                    raise StoreUnavailable("postgresql store unavailable") from None
        # The same conversions whether or not the player exists (a username decoded either way),
        # and the contract's username None picked by indexing, not by a branch (docs/stores.md).
        game_id, game_enabled, expires_at, username, epoch, player_enabled = row
        found = Credentials(
            int(game_id or b"0"),
            game_enabled == b"t",
            None
            if expires_at is None
            else int(expires_at) / 1000,  # unix seconds, to the millisecond
            (None, username.decode())[player_enabled is not None],
            int(epoch),
            player_enabled == b"t",
        )
        return None if game_id is None else found

    def fresh_credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        """``credentials`` again: on a primary every read is of the latest commit already; on a hot
        standby it is what the standby has replayed by now, the latest within reach (the web process
        holds no connection to the primary; docs/stores.md, "Bounded staleness")."""
        return self.credentials(key_digest, user_id)

    def _log_failure(self, error: psycopg.Error) -> None:
        """One line per FAILURE_WARNING_INTERVAL per process (docs/logs.md, "Floods"): an outage
        fails every request, each of which is in the access log anyway."""
        held = self._failures.allow()
        if held is not None:
            since = f" ({held} more since the last such line)" if held else ""
            retry = (
                f"; answering 503 for {self._retry_after:g} s before trying again"
                if _timed_out(error)
                else ""
            )
            log.warning(
                "postgresql store unavailable: %s (sqlstate %s)%s%s",
                type(error).__name__,
                error.sqlstate,
                retry,
                since,
            )

    def _credentials_row(self, conn: psycopg.Connection, key_digest: str, user_id: int) -> list:
        """The credentials query through libpq itself, one round trip with text values: on a direct
        connection the statement prepared once, then Bind/Execute/Sync; behind a pooler an unnamed
        statement, Parse/Bind/Describe/Execute/Sync in one go (docs/stores.md, "pgbouncer").
        psycopg's cursor machinery around the same round trip cost more than the round trip's own
        CPU (BENCHMARKS.md). Errors are raised as psycopg's."""
        pgconn = conn.pgconn
        local = self._local
        params = [b"%d" % user_id, key_digest.encode("ascii")]
        name, sql = CREDENTIALS_STATEMENT, CREDENTIALS_SQL_PQ
        # Behind a pooler the server can change under the connection (repointed at a standby):
        # check.
        checked = local.standby or local.pooled
        if checked:
            name, sql = STANDBY_STATEMENT, STANDBY_SQL_PQ
        if local.pooled:
            pgconn.send_query_params(sql, params)
        else:
            if not local.prepared:
                pgconn.send_prepare(name, sql)
                _raise_unless(self._reply(pgconn), ExecStatus.COMMAND_OK)
                local.prepared = True
            pgconn.send_query_prepared(name, params)
        result = self._reply(pgconn)
        _raise_unless(result, ExecStatus.TUPLES_OK)
        if checked:
            self._fresh_or_raise(result.get_value(0, 6))
        return [result.get_value(0, column) for column in range(6)]  # one row, always

    def _fresh_or_raise(self, age_ms: bytes | None) -> None:
        """A standby whose heartbeat is older than AUTHSVC_MAX_STALENESS, or missing, answers
        503."""
        age = None if age_ms is None else int(age_ms)
        if age is not None and age <= self._max_lag_ms:
            return
        missing = age is None
        now, (was_missing, logged_at) = time.monotonic(), self._stale_logged
        if (
            missing != was_missing or now - logged_at >= STALE_WARNING_INTERVAL
        ):  # a new reason, or 10 s on
            self._stale_logged = (missing, now)
            log.warning(
                "postgresql store unavailable: the standby's heartbeat %s, AUTHSVC_MAX_STALENESS "
                "is %g s: is 'authsvc heartbeat' writing on the primary, and is the standby "
                "replaying? (docs/stores.md)",
                "row is missing" if age is None else f"is {age / 1000:.1f} s old",
                self._max_lag_ms / 1000,
            )
        raise StoreUnavailable(
            "postgresql store unavailable: the standby cannot show it is fresh enough"
        )

    def list_games(self) -> list[Game]:
        try:
            conn = self._conn()
            with conn.transaction():  # one snapshot for games and keys
                return select_games(conn, collate=COLLATE_C)
        except psycopg.Error as e:
            self._drop()
            raise StoreUnavailable(
                f"postgresql store {redact_url(self.url)}: {_reason(e, self._secrets)}"
            ) from None

    def token_secrets(self) -> dict[str, int]:
        try:
            conn = self._conn()
            with conn.transaction():
                return select_token_secrets(conn)
        except psycopg.Error as e:
            self._drop()
            raise StoreUnavailable(
                f"postgresql store {redact_url(self.url)}: {_reason(e, self._secrets)}"
            ) from None

    def check(self) -> None:
        where = f"postgresql store {redact_url(self.url)}"
        try:
            conn = self._connect()
        except psycopg.Error as e:
            if _unreachable(e):
                raise StoreUnreachable(
                    f"{where} is unreachable: {_reason(e, self._secrets)}"
                ) from None
            raise ConfigError(
                f"{where} refuses the connection: {_reason(e, self._secrets)}"
            ) from None
        try:
            version = self._version(conn)
            newer_fails = (
                self._queries_fail(conn) if self.readonly and version > SCHEMA_VERSION else None
            )
            if self.readonly and version and self._can_write(conn):
                log.warning(
                    "%s: the web process's role can write to the store; give it a read-only role "
                    "(%s, docs/stores.md)",
                    where,
                    READER_ROLE,
                )
            standby = (
                self.readonly
                and self._max_lag_ms < round(1000 * STANDBY_MIN_STALENESS)
                and self._in_recovery(conn)
            )
        except psycopg.errors.InsufficientPrivilege:
            # Read-write is the admin command (the owner) or the heartbeat writer, which is no
            # reader.
            fix = (
                f"GRANT {READER_ROLE} to it"
                if self.readonly
                else "the admin command connects as the owner; the heartbeat writer's rights come "
                "with 'authsvc init'"
            )
            raise ConfigError(
                f"{where}: this role may not read the tables ({fix}, docs/stores.md)"
            ) from None
        except psycopg.OperationalError as e:  # the server went away during the check
            raise StoreUnreachable(f"{where} cannot be read: {_reason(e, self._secrets)}") from None
        except psycopg.Error as e:
            raise ConfigError(f"{where} cannot be read: {_reason(e, self._secrets)}") from None
        finally:
            conn.close()
        check_schema(where, version, SCHEMA_VERSION, self.readonly, lambda: newer_fails)
        if standby:
            raise ConfigError(
                f"{where} is a hot standby and AUTHSVC_MAX_STALENESS is "
                f"{self._max_lag_ms / 1000:g} s: it can show its freshness only to within the "
                "heartbeat's 0.2 s plus the replication delay, so it would answer 503; set it to "
                f'at least {STANDBY_MIN_STALENESS:g} s (docs/stores.md, "Hot standby")'
            )

    def _value(self, conn: psycopg.Connection, sql: bytes) -> bytes | None:
        """The first value of a one-row query, as text, its reply awaited at most
        AUTHSVC_PG_REPLY_TIMEOUT: the start-up check also runs behind /readyz, on the web path."""
        conn.pgconn.send_query(sql)
        result = self._reply(conn.pgconn)
        _raise_unless(result, ExecStatus.TUPLES_OK)
        return result.get_value(0, 0) if result.ntuples else None

    def _queries_fail(self, conn: psycopg.Connection) -> str | None:
        """Why this release's read queries fail on a newer schema, or None: each one run once, its
        reply awaited at most AUTHSVC_PG_REPLY_TIMEOUT. The server going away is raised, not
        returned."""
        pgconn = conn.pgconn
        try:
            for sql, params in (
                (STANDBY_SQL_PQ, [b"0", b""]),
                (GAMES_SQL.format(where="").encode(), None),
                (KEYS_SQL.format(collate=COLLATE_C).encode(), None),
            ):
                if params is None:
                    pgconn.send_query(sql)
                else:
                    pgconn.send_query_params(sql, params)
                _raise_unless(self._reply(pgconn), ExecStatus.TUPLES_OK)
            select_token_secrets(conn)
        except psycopg.OperationalError:
            raise
        except psycopg.DatabaseError as e:
            return _reason(e, self._secrets)
        return None

    def _in_recovery(self, conn: psycopg.Connection) -> bool:
        return self._value(conn, b"SELECT pg_is_in_recovery()") == b"t"

    def _can_write(self, conn: psycopg.Connection) -> bool:
        return (
            self._value(
                conn,
                b"SELECT bool_or(has_table_privilege(t, 'INSERT, UPDATE, DELETE, TRUNCATE')) "
                b"FROM unnest(ARRAY['games', 'api_keys', 'players']) AS t",
            )
            == b"t"
        )

    def _version(self, conn: psycopg.Connection) -> int:
        if self._value(conn, b"SELECT to_regclass('authsvc_schema')") is None:
            return 0
        return int(self._value(conn, b"SELECT max(version) FROM authsvc_schema") or 0)
