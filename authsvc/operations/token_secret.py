"""The token secret file: rotate, retire and list its secrets with no restart, and the secrets the
command mints with (docs/tokens.md, "Rotation").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator, Sequence

from authsvc.errors import ConfigError, Invalid
from authsvc.operations.context import Context
from authsvc.settings import (
    MAX_STALENESS_BOUND,
    Settings,
    TokenSecrets,
    load_token_secrets,
)
from authsvc.store.base import Store
from authsvc.tokens import (
    check_known,
    fingerprint,
    new_token_secret,
)

# How long `authsvc secret rotate` waits between adding the new secret as a non-first line and
# making it the one minted with: every running process re-reads the file within
# AUTHSVC_MAX_STALENESS (at most 1 s), so a token minted with the new secret is accepted everywhere
# (docs/design.md, "Freshness").
ROTATE_SETTLE = 2 * MAX_STALENESS_BOUND


def write_secret_file(path: str, token_secrets: Sequence[bytes]) -> None:
    """Replace the secret file at once (a new file renamed over it): mode 0600, its owner and group
    kept. A reader sees the old file or the new one, never a part."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise Invalid(f"cannot read token secret file {path}: {e.strerror}") from None
    try:
        fd, temp = tempfile.mkstemp(prefix=".token-secret.", dir=directory)
    except OSError as e:
        raise Invalid(
            f"cannot write a file in {directory} (for {path}): {e.strerror}; the secret's "
            "directory must be writable by the user the command runs as (docs/operations.md)"
        ) from None
    try:
        os.fchmod(fd, 0o600)
        if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, old.st_uid, old.st_gid)
        os.write(fd, b"".join(s + b"\n" for s in token_secrets))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(temp, path)
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise Invalid(f"cannot write token secret file {path}: {e.strerror}") from None
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def _secret_file_lock(path: str) -> Iterator[None]:
    """One `authsvc secret` at a time on a file: a lock on its directory (the file itself is
    replaced)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _known_secrets(store: Store, path: str) -> tuple[TokenSecrets, dict[str, int]]:
    """The file's secrets, re-read now, and the store's fingerprints; ConfigError if the file holds
    none of them."""
    found = load_token_secrets(path)
    known = store.token_secrets()
    check_known(found, known, path)
    return found, known


def token_secrets(store: Store, settings: Settings) -> TokenSecrets:
    """The secrets the admin command mints and checks with: a missing file, or one that holds none
    of the secrets the store knows, is an error naming the file and its backup copy, never a token
    no one accepts."""
    path = settings.token_secret_file
    if not settings.token_secrets:
        with store.write() as tx:  # the writer lock: whether a player exists is read once
            players = tx.any_player()
        raise ConfigError(
            f"no token secret at {path}: "
            + (
                "restore it from its backup copy (a new secret would refuse every token issued)"
                if players
                else "run 'authsvc init' to create one"
            )
        )
    check_known(settings.token_secrets, store.token_secrets(), path)
    return settings.token_secrets


def rotate_token_secret(
    store: Store, ctx: Context, path: str, settle: float = ROTATE_SETTLE
) -> int:
    """``authsvc secret rotate``: a new secret, recorded in the store, then added to the file as its
    last line (accepted, not minted with), and after ``settle`` seconds (every running process has
    re-read the file) made its first (minted with). The older ones stay, accepted, until ``retire``.
    Returns how many older secrets the file keeps."""
    with _secret_file_lock(path):
        found, _ = _known_secrets(store, path)
        secret = new_token_secret().encode("ascii")
        with store.write(ctx.audit()) as tx:
            tx.record_token_secrets([fingerprint(secret)], "token_secret.rotate")
        write_secret_file(path, [*found, secret])
        time.sleep(settle)
        write_secret_file(path, [secret, *found])
    return len(found)


def retire_token_secrets(store: Store, ctx: Context, path: str) -> int:
    """``authsvc secret retire``: keep only the file's first secret (the one minted with), in the
    file and in the store: the tokens minted with the others are refused within
    AUTHSVC_MAX_STALENESS. Returns how many were retired."""
    with _secret_file_lock(path):
        found, known = _known_secrets(store, path)
        if fingerprint(found[0]) not in known:
            raise Invalid(
                f"the first secret of {path} is not one the store knows: retiring the others would "
                "leave none; run 'authsvc secret rotate' instead of editing the file"
            )
        older = found[1:]
        if older:
            write_secret_file(path, found[:1])
        with store.write(ctx.audit()) as tx:
            tx.record_token_secrets([], "token_secret.retire", drop=[fingerprint(s) for s in older])
    return len(older)


def list_token_secrets(store: Store, path: str) -> list[dict]:
    """The file's secrets in order, as their fingerprints' first 12 characters (never a secret), and
    when the store recorded each (unix seconds; None: unknown to the store)."""
    found = load_token_secrets(path)
    known = store.token_secrets()
    rows = []
    for i, secret in enumerate(found):
        fp = fingerprint(secret)
        rows.append(
            {
                "position": i + 1,
                "minted_with": i == 0,
                "fingerprint": fp[:12],
                "recorded_at": None if fp not in known else known[fp] // 1000,
            }
        )
    return rows
