"""The admin API's bearer tokens: their format, scopes and rows (docs/admin-api.md, "Tokens and scopes").

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

from authsvc.store.base import ApiToken

PREFIX = "asv_"
SCOPES = ("players:read", "players:write", "tokens:mint", "games:read", "games:write", "audit:read",
          "webhooks:read", "webhooks:write")
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
