"""Pick the store engine from the ``AUTHSVC_STORE`` URL."""

from __future__ import annotations

import urllib.parse

from authsvc.errors import ConfigError
from authsvc.settings import default
from authsvc.store.base import Store


def open_store(url: str, *, readonly: bool, settings=None) -> Store:
    """``sqlite://PATH`` or ``postgresql://...``; the engine module is imported only when chosen."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from authsvc.store.sqlite import SQLiteStore

        # Without settings, the declared default (authsvc/settings.py): one number, not two.
        staleness = settings.max_staleness if settings is not None else default("max_staleness")
        return SQLiteStore(url, readonly=readonly, max_staleness=staleness)
    if scheme in ("postgresql", "postgres"):
        try:
            from authsvc.store.postgres import PostgresStore
        except ImportError as e:
            raise ConfigError(f"the PostgreSQL store needs the 'postgres' extra: {e}") from None
        return PostgresStore(url, readonly=readonly, settings=settings)
    raise ConfigError("AUTHSVC_STORE must start with sqlite:// or postgresql://")


def redact_url(url: str) -> str:
    """The store URL with any password (``user:PASSWORD@`` or ``?password=``) masked, for messages."""
    parts = urllib.parse.urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = userinfo.split(":", 1)[0] + ":***@" + hostport
    if "password" in query.lower():
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{name}=***" if name.lower() == "password" else urllib.parse.urlencode({name: value})
            for name, value in pairs
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
