"""The store as a whole: ``init`` (create or migrate it, settle the token secret file), ``export``,
``import``, ``backup`` (docs/operations.md; docs/stores.md).
"""

from __future__ import annotations

import hashlib
import os

from authsvc.errors import Invalid
from authsvc.operations import transfer
from authsvc.operations.context import Context, admin_store
from authsvc.operations.token_secret import write_secret_file
from authsvc.settings import (
    Settings,
    load_token_secrets,
)
from authsvc.store.base import Store
from authsvc.store.sqlite.store import SQLiteStore
from authsvc.tokens import (
    check_known,
    fingerprint,
    new_token_secret,
)


def export_store(store: Store, path: str) -> tuple[int, int]:
    """Write the store to a new file (a read: no audit record); returns (games, players)."""
    return transfer.export_store(store, path)


def import_store(store: Store, ctx: Context, path: str) -> tuple[int, int]:
    """Load an export file into an empty store, all or nothing; one audit record (counts, the file's
    SHA-256)."""
    try:
        with open(path, "rb") as f:
            sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        sha256 = None  # transfer.import_store names the problem
    return transfer.import_store(store, path, audit=ctx.audit(file_sha256=sha256))


def initialize(
    settings: Settings, ctx: Context, *, new_secret: bool = False
) -> tuple[int, int, str]:
    """``authsvc init``: create or migrate the store, then settle the token secret file against the
    store's fingerprints (authsvc/tokens.py); returns (schema version before, after, what became of
    the secret):

    - "kept": the file holds a secret the store knows; a file that holds none is refused
    (ConfigError);
    - "adopted": a store from before fingerprints (none recorded): the file's secrets are recorded;
    - "created": no file and no player: a new secret (mode 0600), recorded;
    - "new": ``new_secret``, said in words: a new secret replaces the file and every recorded one,
    and
      every token issued before is refused. Without it, a missing file of a store with players is
      refused (Invalid): restore it from its backup copy.

    Setting a store up (the migration, the first secret, the adopted ones) writes no audit record; a
    new secret that replaces the recorded ones (``new_secret``) has one."""
    store_context = admin_store(
        settings, check=False
    )  # a bad AUTHSVC_STORE stops here, before any file is made
    path = settings.token_secret_file
    with store_context as store:
        if isinstance(store, SQLiteStore):  # the file's directory may not exist yet
            os.makedirs(os.path.dirname(os.path.abspath(store.path)), exist_ok=True)
        before, after = store.migrate()
        present = os.path.exists(path)
        with store.write(ctx.audit()) as tx:
            known = tx.token_secrets()
            if new_secret or not present:
                if not new_secret and tx.any_player():
                    raise Invalid(
                        f"token secret file {path} is missing and the store has players: restore "
                        "it from its backup copy (a new secret would refuse every token issued; "
                        "'authsvc init --new-secret' makes one all the same)"
                    )
                secret = new_token_secret().encode("ascii")
                tx.record_token_secrets(
                    [fingerprint(secret)], "token_secret.new" if new_secret else None, replace=True
                )
                os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
                write_secret_file(path, [secret])
                return before, after, "new" if new_secret else "created"
            found = load_token_secrets(path)
            if not known:
                tx.record_token_secrets([fingerprint(s) for s in found], None)
                return before, after, "adopted"
            check_known(found, known, path)
    return before, after, "kept"


def backup(store: Store, path: str) -> None:
    """``authsvc backup``: a SQLite store copied to a new file (a read: no audit record; the copy
    holds the trail)."""
    if not isinstance(store, SQLiteStore):
        raise Invalid(
            "backup copies a SQLite store; back up PostgreSQL with pg_dump (docs/operations.md)"
        )
    store.backup(path)
