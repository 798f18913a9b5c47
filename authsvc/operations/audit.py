"""The audit trail's one write: a prune, whose own record names the new anchor (docs/admin.md,
"The audit trail").
"""

from __future__ import annotations

from authsvc.errors import Invalid
from authsvc.operations.context import Context
from authsvc.store.audit import Record
from authsvc.store.base import Store


def audit_prune(store: Store, ctx: Context, before_ms: int) -> Record:
    """Delete the records older than ``before_ms``; the prune's own record names the new anchor."""
    if before_ms > round(ctx.clock() * 1000):
        raise Invalid("must not be in the future", field="/before")
    with store.write(ctx.audit()) as tx:
        return tx.prune_audit(before_ms)
