"""The admin API's bearer tokens: their format, scopes and rows (docs/admin-api.md, "Tokens and scopes").

A token is ``asv_`` and 43 URL-safe characters (256 random bits), shown once by
``authsvc api-token add``; the store keeps only its SHA-256 digest, and a request's
token is found by the digest of what it presents (a lookup by a digest of 256
random bits gives nothing to time). The prefix lets secret scanners and people
tell it from a game's api key. Names are 1 to 64 ASCII letters, digits, '.', '_'
or '-', never reused: the audit trail's actor is ``api:<name>``.

The SQL runs in the engine's transaction (``store.admin_transaction()``) on either
engine; each change appends its audit record there (store/audit.py), with the
name, scopes and times, never the token or its digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets

from authsvc.store import audit as trail
from authsvc.store.audit import Audit

PREFIX = "asv_"
SCOPES = ("players:read", "players:write", "tokens:mint", "games:read", "games:write", "audit:read")
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TOKEN = re.compile(PREFIX + r"[A-Za-z0-9_-]{43}")
_COLUMNS = "name, scopes, created_at, expires_at, revoked_at"


@dataclasses.dataclass(frozen=True, slots=True)
class ApiToken:
    name: str
    scopes: tuple[str, ...]
    created_at: int
    expires_at: int | None
    revoked_at: int | None

    def live(self, now: int) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def as_json(self) -> dict:
        return {"name": self.name, "scopes": list(self.scopes), "created_at": self.created_at,
                "expires_at": self.expires_at, "revoked_at": self.revoked_at}


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def well_formed(token: str) -> bool:
    """A string that could be a token: anything else is refused without a store round trip."""
    return _TOKEN.fullmatch(token) is not None


def _sql(text: str, pg: bool) -> str:
    return text.replace("?", "%s") if pg else text


def _token(row) -> ApiToken:
    return ApiToken(row[0], tuple(row[1].split()), row[2], row[3], row[4])


def insert(conn, pg: bool, audit: Audit, name: str, token_digest: str, scopes: tuple[str, ...],
           now: int, expires_at: int | None) -> ApiToken | None:
    """The new token's row and its audit record; None if the name (or, by chance, the digest) is taken."""
    cur = conn.execute(
        _sql("INSERT INTO api_tokens (name, digest, scopes, created_at, expires_at) VALUES (?, ?, ?, ?, ?) "
             "ON CONFLICT DO NOTHING", pg),
        (name, token_digest, " ".join(scopes), now, expires_at),
    )
    if cur.rowcount != 1:
        return None
    token = ApiToken(name, scopes, now, expires_at, None)
    after = {"name": name, "scopes": list(scopes), "expires_at": expires_at}
    trail.append(conn, pg, audit, "api_token.add", after=after)
    return token


def select_all(conn, pg: bool) -> list[ApiToken]:
    return [_token(row) for row in conn.execute(f"SELECT {_COLUMNS} FROM api_tokens ORDER BY name").fetchall()]


def by_digest(conn, pg: bool, token_digest: str) -> ApiToken | None:
    row = conn.execute(_sql(f"SELECT {_COLUMNS} FROM api_tokens WHERE digest = ?", pg), (token_digest,)).fetchone()
    return None if row is None else _token(row)


def revoke(conn, pg: bool, audit: Audit, name: str, now: int) -> ApiToken | None:
    """Mark the token revoked (once: a second revoke changes nothing and writes no record); None if no such name."""
    row = conn.execute(
        _sql(f"SELECT {_COLUMNS} FROM api_tokens WHERE name = ?" + (" FOR UPDATE" if pg else ""), pg), (name,)
    ).fetchone()
    if row is None:
        return None
    token = _token(row)
    if token.revoked_at is not None:
        return token
    conn.execute(_sql("UPDATE api_tokens SET revoked_at = ? WHERE name = ?", pg), (now, name))
    trail.append(conn, pg, audit, "api_token.revoke", before={"name": name, "revoked_at": None},
                 after={"name": name, "revoked_at": now})
    return dataclasses.replace(token, revoked_at=now)
