"""The ``sqlite://PATH`` store URL and the file it names: the one parser for the admin command and
the web process.

store/sqlite/reader.py re-exports it (store/sqlite/store.py imports it from there).
"""

from __future__ import annotations

import os

from authsvc.errors import ConfigError


def path_from_url(url: str) -> str:
    """The file named by a ``sqlite://PATH`` store URL: the one parser for the admin command and the
    web process.

    Everything after ``sqlite://`` is the path, taken literally (no %-decoding, no
    query string or fragment), so ``sqlite:///var/x.db`` is absolute and
    ``sqlite://var/x.db`` relative to the working directory. SQLAlchemy's
    ``sqlite:////var/x.db`` is absolute too: two or more leading slashes are one.
    Anything else raises ConfigError with one line (docs/configuration.md).
    """
    scheme, sep, path = url.partition("://")
    if scheme.lower() != "sqlite" or not sep:
        raise ConfigError(_bad_url("it does not start with sqlite://"))
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if os.path.basename(path) in ("", ".", ".."):
        raise ConfigError(_bad_url("it names no file after sqlite://"))
    if "\0" in path:
        raise ConfigError(_bad_url("the path holds a NUL character"))
    return path


def _bad_url(reason: str) -> str:
    return (
        f"AUTHSVC_STORE is not a usable sqlite:// URL: {reason}; write sqlite:///absolute/path.db "
        "or sqlite://relative/path.db (docs/configuration.md)"
    )
