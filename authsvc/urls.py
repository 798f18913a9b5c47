"""A store URL as a message may show it: every secret it holds masked (``redact_url``).

Below both the settings and the store, which each name a store URL in their errors: neither
imports the other for it.
"""

from __future__ import annotations

import urllib.parse

# libpq's parameters that hold a secret: those PQconndefaults marks "*" (shown masked) and
# the SCRAM keys it takes for pass-through authentication. Any other parameter whose name
# holds "password" or "secret" is masked too: a newer libpq may add one.
SECRET_PARAMS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
MASK = "***"


def redact_url(url: str) -> str:
    """The store URL for a message: the userinfo password and the value of every secret
    parameter masked; never raises (a URL it cannot read is masked whole).

    Read as libpq reads a URL, not as urllib does: the password may hold an unescaped
    ``?``, ``#`` or ``@``, and a parameter's name is percent-decoded (``pass%77ord`` is
    the password). A SQLite URL is a file path and holds no secret."""
    try:
        return _redacted(url)
    except Exception:  # a message must still be written: say only which kind of store
        scheme = url.partition("://")[0] if isinstance(url, str) else ""
        return f"{scheme}://{MASK}" if scheme.isalpha() else MASK


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if scheme.lower() == "sqlite":
        return url
    if not sep:  # not a URL (the store refuses it): nothing here can be told from a secret
        return MASK
    # The userinfo ends at the last "@" before the query: the first "?" after the first "/"
    # (a password may hold either, unescaped), or the end. An "@" further on (a database or
    # application name) can only mask more than needed, never less.
    slash = rest.find("/")
    query_at = rest.find("?", slash) if slash >= 0 else -1
    at = rest.rfind("@", 0, query_at if query_at >= 0 else len(rest))
    userinfo, hostpart = (rest[:at], rest[at:]) if at >= 0 else ("", rest)
    user, colon, _ = userinfo.partition(":")
    if colon:
        userinfo = user + ":" + MASK
    base, question, query = hostpart.partition("?")
    if question:
        pairs = []
        for pair in query.split("&"):
            name, equals, _ = pair.partition("=")
            key = urllib.parse.unquote(name).strip().lower()
            secret = key in SECRET_PARAMS or "password" in key or "secret" in key
            pairs.append(f"{name}={MASK}" if equals and secret else pair)
        query = "&".join(pairs)
    return f"{scheme}://{userinfo}{base}{question}{query}"
