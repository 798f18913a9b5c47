"""The admin API's bearer tokens: their format, scopes and rows (docs/admin-api.md, "Tokens and
scopes").

A token is ``asv_`` and 43 URL-safe characters (256 random bits), shown once by
``authsvc api-token add``; the store keeps only its SHA-256 digest, and a request's
token is found by the digest of what it presents (a lookup by a digest of 256
random bits gives nothing to time). The prefix lets secret scanners and people
tell it from a game's api key. Names are 1 to 64 ASCII letters, digits, '.', '_'
or '-', never reused: the audit trail's actor is ``api:<name>``.

The rows are the store's (store/writes.py writes them, each change with its audit
record: the name, scopes and times, never the token or its digest).
"""

from __future__ import annotations

import hashlib
import re
import secrets

from authsvc.errors import Conflict, Invalid, NotFound
from authsvc.operations.context import MAX_OLD_KEY_TTL, Context
from authsvc.store.base import ApiToken, Store

PREFIX = "asv_"
SCOPES = (
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
    "webhooks:read",
    "webhooks:write",
)
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TOKEN = re.compile(PREFIX + r"[A-Za-z0-9_-]{43}")
__all__ = ["PREFIX", "SCOPES", "NAME", "ApiToken", "new_token", "digest", "well_formed"]


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def well_formed(token: str) -> bool:
    """A string that could be a token: anything else is refused without a store round trip."""
    return _TOKEN.fullmatch(token) is not None


def check_api_token_request(
    name: str, scopes: list[str], expires_in: int | None
) -> tuple[str, ...]:
    """The rules of ``api-token add``, checked before the store is opened; returns the scopes,
    sorted, once each."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise Invalid("a token name is 1 to 64 ASCII letters, digits, '.', '_' or '-'")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise Invalid(f"must be given once or more, from: {', '.join(SCOPES)}", field="/scope")
    if expires_in is not None and (
        type(expires_in) is not int or not 1 <= expires_in <= MAX_OLD_KEY_TTL
    ):
        raise Invalid(
            f"must be from 1 to {MAX_OLD_KEY_TTL} seconds (ten years)", field="/expires_in"
        )
    return tuple(s for s in SCOPES if s in scopes)


def add_api_token(
    store: Store, ctx: Context, name: str, scopes: list[str], expires_in: int | None = None
) -> tuple[ApiToken, str]:
    """A new admin API token: (its row, the token). The token is shown once, stored as its SHA-256
    digest."""
    chosen = check_api_token_request(name, scopes, expires_in)
    token = new_token()
    now = ctx.now()
    with store.write(ctx.audit()) as tx:
        row = tx.add_api_token(
            name, digest(token), chosen, now, None if expires_in is None else now + expires_in
        )
    if row is None:
        raise Conflict(f"an api token named {name!r} exists (names are never reused)")
    return row, token


def list_api_tokens(store: Store) -> list[ApiToken]:
    return store.api_tokens()


def revoke_api_token(store: Store, ctx: Context, name: str) -> ApiToken:
    """The token stops working at once: the admin API looks every request's token up in the
    store."""
    with store.write(ctx.audit()) as tx:
        row = tx.revoke_api_token(name, ctx.now())
    if row is None:
        raise NotFound(f"no api token {name!r}")
    return row


def api_token_for(store: Store, token: str, now: int) -> ApiToken | None:
    """The live token row a bearer token stands for, else None (unknown, expired or revoked: all the
    same 401). A read: it never waits for a writer (an import holding the writer lock)."""
    if not well_formed(token):
        return None
    row = store.api_token_by_digest(digest(token))
    return row if row is not None and row.live(now) else None
