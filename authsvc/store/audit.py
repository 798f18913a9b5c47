"""The audit trail in the store: one hash-chained record per change (docs/admin.md, "The audit
trail").

Every write (store/writes.py) takes an ``Audit`` (who, which request, which clock),
reads the target's non-secret state before the change, makes the change, and
appends one record in the SAME transaction: a failed write leaves no record, a
committed one always has one. The SQL here runs on a sqlite3 or a psycopg
connection alike, spelled by the engine's dialect (store/dialect.py). A record's time
is read once the write holds the writer lock, and never before its predecessor's:
along the chain, time never runs backwards.

The chain: each record's ``hash`` is the SHA-256 (hex) of the canonical JSON of
its other columns, ``prev_hash`` included; ``prev_hash`` is the hash of the
record before, or the anchor's. The one-row ``audit_chain`` table holds the
anchor (the last record ``authsvc audit prune`` removed; id 0 and 64 zeros when
nothing was pruned) and the head (the last record written), so a record removed
from the end shows as well as one removed from the middle. The head is also kept outside
the store: each committed write that appended records logs the new head's id and hash, one
line through the logger ``authsvc.audit`` (``log_head``; docs/logs.md, "The audit head line"),
which ``authsvc audit verify --anchor`` checks the chain against. Never a key, token,
secret or digest of one goes into a record: only ids, usernames, game names,
flags, epochs, key counts and expiry times, counts, and an import file's SHA-256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from authsvc.store.dialect import Dialect

GENESIS = "0" * 64
COLUMNS = (
    "id",
    "at_ms",
    "actor",
    "request_id",
    "action",
    "game_id",
    "user_id",
    "changes",
    "prev_hash",
    "hash",
)
# The tables, each engine's migration (store/sqlite/store.py, store/postgres/store.py). The ids are
# given by append(), never by the database: the hash covers the id, so it must be known before the
# INSERT.
SQLITE_TABLES = f"""
    CREATE TABLE audit (
        id         INTEGER PRIMARY KEY,
        at_ms      INTEGER NOT NULL,
        actor      TEXT NOT NULL,
        request_id TEXT,
        action     TEXT NOT NULL,
        game_id    INTEGER,
        user_id    INTEGER,
        changes    TEXT NOT NULL,
        prev_hash  TEXT NOT NULL,
        hash       TEXT NOT NULL
    );
    CREATE INDEX audit_user_id ON audit (user_id);
    CREATE INDEX audit_game_id ON audit (game_id);
    CREATE TABLE audit_chain (
        id          INTEGER PRIMARY KEY CHECK (id = 1),
        anchor_id   INTEGER NOT NULL,
        anchor_hash TEXT NOT NULL,
        head_id     INTEGER NOT NULL,
        head_hash   TEXT NOT NULL
    );
    INSERT INTO audit_chain VALUES (1, 0, '{GENESIS}', 0, '{GENESIS}');
"""
# PostgreSQL: the web process's roles get no grant at all; the admin role
# (deploy/postgres/roles.sql) may only read and append (`authsvc init` grants it:
# postgres/store.py's ADMIN_GRANTS_SQL). {reader}: READER_ROLE.
POSTGRES_TABLES = f"""
CREATE TABLE audit (
    id         bigint PRIMARY KEY,
    at_ms      bigint NOT NULL,
    actor      text NOT NULL,
    request_id text,
    action     text NOT NULL,
    game_id    bigint,
    user_id    bigint,
    changes    text NOT NULL,
    prev_hash  text NOT NULL,
    hash       text NOT NULL
);
CREATE INDEX audit_user_id ON audit (user_id);
CREATE INDEX audit_game_id ON audit (game_id);
CREATE TABLE audit_chain (
    id          smallint PRIMARY KEY CHECK (id = 1),
    anchor_id   bigint NOT NULL,
    anchor_hash text NOT NULL,
    head_id     bigint NOT NULL,
    head_hash   text NOT NULL
);
INSERT INTO audit_chain VALUES (1, 0, '{GENESIS}', 0, '{GENESIS}');
REVOKE ALL ON audit, audit_chain FROM PUBLIC;
"""
# The chain's head after each committed write that appended records (store/writes.py's Tx.head(),
# logged by the engines' write() once the COMMIT returned): what `authsvc audit verify --anchor`
# reads back.
HEAD_LOG = logging.getLogger("authsvc.audit")
HEAD_LINE = "head id={id} hash={hash}"

# Sealing (docs/admin.md, "Erasure"), a later migration of each engine: the players' keys, the clear
# values beside the records, and the mark of a record written before sealing and erased since.
SQLITE_SEALING = """
    CREATE TABLE player_keys (
        user_id INTEGER PRIMARY KEY,
        key     TEXT NOT NULL
    );
    CREATE TABLE audit_names (
        record_id INTEGER PRIMARY KEY,
        user_id   INTEGER NOT NULL,
        names     TEXT NOT NULL
    );
    CREATE INDEX audit_names_user_id ON audit_names (user_id);
    ALTER TABLE audit ADD COLUMN erased_by INTEGER
"""
# PostgreSQL: the admin role may read and append the trail, never change a record; the one change an
# erasure makes to a record written before sealing goes through this function, which the owner owns
# and the admin role may only call: it replaces the record's usernames by {"erased": true} and
# nothing else, in a record of a player whose deletion the chain already holds.
POSTGRES_SEALING = """
CREATE TABLE player_keys (
    user_id bigint PRIMARY KEY,
    key     text NOT NULL
);
CREATE TABLE audit_names (
    record_id bigint PRIMARY KEY,
    user_id   bigint NOT NULL,
    names     text NOT NULL
);
CREATE INDEX audit_names_user_id ON audit_names (user_id);
ALTER TABLE audit ADD COLUMN erased_by bigint;
REVOKE ALL ON player_keys, audit_names FROM PUBLIC;
CREATE FUNCTION authsvc_erase_names(record bigint, erased text, by_record bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    old text;
    player bigint;
    expected jsonb;
    side text;
BEGIN
    SELECT a.changes, a.user_id INTO old, player FROM audit AS a
        WHERE a.id = record AND a.erased_by IS NULL
        FOR UPDATE;
    IF NOT FOUND OR player IS NULL THEN
        RAISE EXCEPTION 'audit record % is not a record of a player that was never erased', record;
    END IF;
    IF NOT EXISTS (SELECT FROM audit AS d WHERE d.id = by_record AND d.id > record
                   AND d.action = 'player.delete' AND d.user_id = player) THEN
        RAISE EXCEPTION 'audit record % is not a later player.delete of player %',
            by_record, player;
    END IF;
    expected := old::jsonb;
    FOREACH side IN ARRAY ARRAY['before', 'after'] LOOP
        IF jsonb_typeof(expected #> ARRAY[side, 'username']) = 'string' THEN
            expected := jsonb_set(expected, ARRAY[side, 'username'], '{"erased": true}');
        END IF;
    END LOOP;
    IF expected = old::jsonb OR expected IS DISTINCT FROM erased::jsonb THEN
        RAISE EXCEPTION
            'the new changes of audit record % differ from it by more than its usernames', record;
    END IF;
    UPDATE audit SET changes = erased, erased_by = by_record WHERE id = record;
END
$$;
REVOKE ALL ON FUNCTION authsvc_erase_names(bigint, text, bigint) FROM PUBLIC;
"""
PERSONAL = (
    "username",
)  # a player's fields that name a person: sealed in the chain, erased with the player
ERASED = {
    "erased": True
}  # what a personal value shows as (and a clear one becomes) once its player is deleted
UNATTRIBUTED = (
    "unattributed"  # the actor of a write made without an Audit (test fixtures, benchmarks)
)


@dataclasses.dataclass(frozen=True, slots=True)
class Audit:
    """Who makes a write and by which clock; ``detail``: non-secret facts only the caller knows (a
    file's SHA-256).

    ``at_ms`` None (the operations layer's): the write reads ``clock`` once it holds the writer
    lock. A fixed ``at_ms`` (fixtures that seed a store) is used as it is, but never before the
    chain's head."""

    actor: str
    request_id: str | None
    at_ms: int | None = None
    detail: tuple[tuple[str, Any], ...] = ()
    clock: Callable[[], float] = time.time

    def now_ms(self) -> int:
        return self.at_ms if self.at_ms is not None else round(self.clock() * 1000)


def unattributed() -> Audit:
    """What a write made without an Audit records: the trail is never skipped, only unattributed."""
    return Audit(UNATTRIBUTED, None)


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    id: int
    at_ms: int
    actor: str
    request_id: str | None
    action: str
    game_id: int | None
    user_id: int | None
    changes: str  # canonical JSON {"before": {...}, "after": {...}}, hashed as this text
    prev_hash: str
    hash: str
    # Beside the chain, covered by no hash: the clear values of the sealed fields (canonical JSON
    # {"before": {...}, "after": {...}}; None: none, or erased), the deletion that erased a record
    # written before sealing, and (Store.audit_walk only) the player's key, for verify.
    names: str | None = None
    erased_by: int | None = None
    key: str | None = dataclasses.field(default=None, repr=False)

    def computed_hash(self) -> str:
        return record_hash({name: getattr(self, name) for name in COLUMNS if name != "hash"})

    def shown_changes(self) -> dict:
        """``changes`` as it is shown: each sealed value as its clear value while it is kept, else
        ERASED."""
        changes = json.loads(self.changes)
        clear = json.loads(self.names) if self.names else {}
        for side, values in changes.items():
            if not isinstance(values, dict):
                continue
            for name, value in values.items():
                if name in PERSONAL and isinstance(value, dict) and "hmac" in value:
                    values[name] = clear.get(side, {}).get(name, ERASED)
        return changes

    def as_json(self) -> dict:
        """The record for ``authsvc audit --json``: its columns, ``changes`` as shown
        (shown_changes)."""
        obj = {name: getattr(self, name) for name in COLUMNS}
        obj["changes"] = self.shown_changes()
        return obj


@dataclasses.dataclass(frozen=True, slots=True)
class Chain:
    """The audit_chain row: where the records start (the prune anchor) and end (the head)."""

    anchor_id: int
    anchor_hash: str
    head_id: int
    head_hash: str


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def record_hash(fields: dict) -> str:
    return hashlib.sha256(canonical(fields).encode("ascii")).hexdigest()


def game_state(conn, d: Dialect, game_id: int) -> dict | None:
    """A game's non-secret fields (name, enabled, key count, keys that never expire); None if no
    such game."""
    row = conn.execute(d.sql("SELECT name, enabled FROM games WHERE id = ?"), (game_id,)).fetchone()
    if row is None:
        return None
    keys, never = conn.execute(
        d.sql("SELECT count(*), count(*) - count(expires_at) FROM api_keys WHERE game_id = ?"),
        (game_id,),
    ).fetchone()
    return {"name": row[0], "enabled": bool(row[1]), "keys": keys, "keys_never_expiring": never}


def player_state(conn, d: Dialect, user_id: int) -> dict | None:
    """A player's username, enabled flag and credential epoch; None if no such player."""
    row = conn.execute(
        d.sql("SELECT username, enabled, epoch FROM players WHERE user_id = ?"), (user_id,)
    ).fetchone()
    return None if row is None else {"username": row[0], "enabled": bool(row[1]), "epoch": row[2]}


def new_key() -> str:
    """A player's sealing key: 32 random bytes, hex."""
    return os.urandom(32).hex()


def seal(key: str, name: str, value: str) -> dict:
    """A personal value as the chain holds it: its HMAC-SHA256 under the player's key (the field's
    name in it)."""
    message = f"{name}\0{value}".encode("utf-8", "surrogatepass")
    return {"hmac": hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()}


def sealed(key: str, state: dict | None) -> tuple[dict, dict]:
    """``state`` with each personal value sealed, and those values in clear: (for the chain, for
    audit_names)."""
    out, clear = dict(state or {}), {}
    for name in PERSONAL:
        if isinstance(out.get(name), str):
            clear[name] = out[name]
            out[name] = seal(key, name, out[name])
    return out, clear


def read_chain(conn, d: Dialect) -> Chain:
    row = conn.execute(
        "SELECT anchor_id, anchor_hash, head_id, head_hash FROM audit_chain WHERE id = 1"
    ).fetchone()
    return Chain(*row)


def log_head(head: tuple[int, str] | None) -> None:
    """The head line of a committed write (None: it appended no record, and logs nothing)."""
    if head is not None:
        HEAD_LOG.info(HEAD_LINE.format(id=head[0], hash=head[1]))


def head_time(conn, d: Dialect, head_id: int) -> int:
    """The head record's time (0 with no record): a new record is never dated before it."""
    row = conn.execute(d.sql("SELECT at_ms FROM audit WHERE id = ?"), (head_id,)).fetchone()
    return 0 if row is None else row[0]


def append(
    conn,
    d: Dialect,
    audit: Audit,
    at_ms: int,
    action: str,
    *,
    game_id: int | None = None,
    user_id: int | None = None,
    before: dict | None = None,
    after: dict | None = None,
    names: dict | None = None,
) -> Record:
    """Append one record after the chain's head, in the caller's transaction, and move the head.
    ``names``: the clear values of what ``before`` and ``after`` hold sealed, kept in audit_names.

    The caller holds the writer lock (store/writes.py), so no other append runs meanwhile."""
    chain = read_chain(conn, d)
    changes = canonical({"before": before or {}, "after": (after or {}) | dict(audit.detail)})
    fields: dict[str, Any] = {
        "id": chain.head_id + 1,
        "at_ms": at_ms,
        "actor": audit.actor,
        "request_id": audit.request_id,
        "action": action,
        "game_id": game_id,
        "user_id": user_id,
        "changes": changes,
        "prev_hash": chain.head_hash,
    }
    record = Record(**fields, hash=record_hash(fields))
    conn.execute(
        d.sql(f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"),
        tuple(getattr(record, name) for name in COLUMNS),
    )
    conn.execute(
        d.sql("UPDATE audit_chain SET head_id = ?, head_hash = ? WHERE id = 1"),
        (record.id, record.hash),
    )
    if names and any(names.values()):
        kept = canonical(names)
        conn.execute(
            d.sql("INSERT INTO audit_names (record_id, user_id, names) VALUES (?, ?, ?)"),
            (record.id, user_id, kept),
        )
        record = dataclasses.replace(record, names=kept)
    return record


def erase_clear_names(conn, d: Dialect, user_id: int) -> list[tuple[int, str, str]]:
    """The records of ``user_id`` written before sealing that hold a personal value in clear: each
    as (id, its changes with every such value ERASED, the hash of the record with those changes)."""
    like = " OR ".join("changes LIKE ?" for _ in PERSONAL)
    rows = conn.execute(
        d.sql(
            f"SELECT {', '.join(COLUMNS)} FROM audit WHERE user_id = ? AND erased_by IS NULL AND "
            f"({like}) ORDER BY id"
        ),
        (user_id, *(f'%"{name}":"%' for name in PERSONAL)),
    ).fetchall()
    erased = []
    for row in rows:
        record = Record(*row)
        changes = json.loads(record.changes)
        for values in changes.values():
            for name in PERSONAL:
                if isinstance(values, dict) and isinstance(values.get(name), str):
                    values[name] = ERASED
        text = canonical(changes)
        if text != record.changes:
            erased.append(
                (record.id, text, dataclasses.replace(record, changes=text).computed_hash())
            )
    return erased


_SELECTED = ", ".join(f"a.{name}" for name in COLUMNS) + ", n.names, a.erased_by"
_FROM = "FROM audit AS a LEFT JOIN audit_names AS n ON n.record_id = a.id"


def select(
    conn,
    d: Dialect,
    *,
    since_ms: int | None = None,
    user_id: int | None = None,
    game_id: int | None = None,
    action: str | None = None,
    actor: str | None = None,
    limit: int = 100,
    before_id: int | None = None,
) -> list[Record]:
    """Records matching every filter given, newest first; ``before_id``: older than that record (a
    page's cursor)."""
    where, args = [], []
    for column, op, value in (
        ("at_ms", ">=", since_ms),
        ("user_id", "=", user_id),
        ("game_id", "=", game_id),
        ("action", "=", action),
        ("actor", "=", actor),
        ("id", "<", before_id),
    ):
        if value is not None:
            where.append(f"a.{column} {op} ?")
            args.append(value)
    sql = f"SELECT {_SELECTED} {_FROM}" + (" WHERE " + " AND ".join(where) if where else "")
    rows = conn.execute(d.sql(sql + " ORDER BY a.id DESC LIMIT ?"), (*args, limit)).fetchall()
    return [Record(*row) for row in rows]


def walk(conn, d: Dialect, batch: int = 10_000) -> Iterator[Record]:
    """Every record, oldest first, with its player's key, in batches (the caller holds one
    snapshot)."""
    last = -1
    while True:
        rows = conn.execute(
            d.sql(
                f"SELECT {_SELECTED}, k.key {_FROM} LEFT JOIN player_keys AS k ON k.user_id = "
                "a.user_id WHERE a.id > ? ORDER BY a.id LIMIT ?"
            ),
            (last, batch),
        ).fetchall()
        for row in rows:
            yield Record(*row)
        if len(rows) < batch:
            return
        last = rows[-1][0]


def prune(conn, d: Dialect, audit: Audit, at_ms: int, before_ms: int) -> Record:
    """Delete the oldest records up to the first one at or after ``before_ms``; the last deleted one
    becomes the anchor, and the prune itself is recorded (its record names the anchor)."""
    chain = read_chain(conn, d)
    first_kept = conn.execute(
        d.sql("SELECT min(id) FROM audit WHERE at_ms >= ?"), (before_ms,)
    ).fetchone()[0]
    cut = chain.head_id if first_kept is None else first_kept - 1
    anchor_id, anchor_hash = chain.anchor_id, chain.anchor_hash
    pruned = 0
    if cut > chain.anchor_id:
        row = conn.execute(d.sql("SELECT hash FROM audit WHERE id = ?"), (cut,)).fetchone()
        if row is not None:
            anchor_id, anchor_hash = cut, row[0]
            pruned = conn.execute(d.sql("DELETE FROM audit WHERE id <= ?"), (cut,)).rowcount
            conn.execute(d.sql("DELETE FROM audit_names WHERE record_id <= ?"), (cut,))
            conn.execute(
                d.sql("UPDATE audit_chain SET anchor_id = ?, anchor_hash = ? WHERE id = 1"),
                (anchor_id, anchor_hash),
            )
    before = {"anchor_id": chain.anchor_id, "anchor_hash": chain.anchor_hash}
    after = {
        "anchor_id": anchor_id,
        "anchor_hash": anchor_hash,
        "pruned": pruned,
        "before_ms": before_ms,
    }
    return append(conn, d, audit, at_ms, "audit.prune", before=before, after=after)
