"""What every operation shares: who acts (``Context``), the admin store the command opens, the
ten-year cap on an expiry, and how a time is shown.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from authsvc import times
from authsvc.errors import ConfigError, Invalid
from authsvc.settings import (
    Settings,
    admin_actor,
)
from authsvc.store import open_store
from authsvc.store.audit import Audit
from authsvc.store.base import Store

# Keys retired by rotate-key expire within ten years: now + TTL stays a 64-bit number on both
# engines.
MAX_OLD_KEY_TTL = 10 * 365 * 86400
MAX_REQUEST_ID = 200  # characters


@dataclasses.dataclass(frozen=True)
class Context:
    """Who acts (``cli:<login>``, ``api:<token name>``), for which request (the service's id, and
    the id the client sent, if any: kept beside it in each record), and the clock to stamp with."""

    actor: str
    request_id: str | None = None
    clock: Callable[[], float] = time.time
    client_request_id: str | None = None

    def __post_init__(self) -> None:
        if not self.actor or not self.actor.isprintable():
            raise Invalid("the actor must be a non-empty printable name")
        for rid in (self.request_id, self.client_request_id):
            if rid is not None and (not rid.isprintable() or len(rid) > MAX_REQUEST_ID):
                raise Invalid(f"a request id must be at most {MAX_REQUEST_ID} printable characters")

    def now(self) -> int:
        return int(self.clock())

    def audit(self, **detail) -> Audit:
        """The store's Audit for one write; ``detail``: non-secret facts for the record (a file's
        SHA-256), and the client's request id."""
        if self.client_request_id is not None:
            detail["client_request_id"] = self.client_request_id
        return Audit(self.actor, self.request_id, None, tuple(sorted(detail.items())), self.clock)


def command_context() -> Context:
    """The admin command's context: the person running it (settings.admin_actor), no request id."""
    return Context(actor=admin_actor())


class admin_store:
    """``with admin_store(settings) as store``: an admin (read-write) store, closed afterwards."""

    def __init__(self, settings: Settings, *, check: bool = True):
        self.store: Store = open_store(settings.store, readonly=False, settings=settings)
        self.check = check

    def __enter__(self) -> Store:
        if self.check:  # a store that is missing or not migrated: say so, in one line
            try:
                self.store.check()
            except ConfigError:
                self.store.close()
                raise
        return self.store

    def __exit__(self, *exc) -> None:
        self.store.close()


def at_ms(ms: int | None) -> str | None:
    """Unix milliseconds as the admin API and the command show them: RFC 3339 UTC with
    milliseconds."""
    if ms is None:
        return None
    return times.utc(ms)
