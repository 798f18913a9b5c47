"""The delivery process's statements (authsvc/webhooks/deliver.py), on either engine's connection.

A delivery row is one event for one webhook. The deliverer writes them (``fan_out``: the events
after each webhook's mark), reads the due ones and writes each attempt's outcome here. That
bookkeeping is not an audited change: it takes no writer lock (the audit chain's row) and writes
no record, so it never queues behind, or holds up, the admin side for longer than its own short
transaction (a page of outcomes, a batch of fan-out).

One deliverer works on a store at a time: it holds the lease (``take_lease``), renewing it as it
goes; another waits and takes over once the lease runs out or is let go.

Why here and not in the change's transaction: a change writes only its event, so an admin write
costs the same with no webhook or ten (docs/design.md, "The store").

Order: deliveries of one (webhook, user_id) go out one at a time in id order; ``due`` returns only
the first pending delivery of each such chain (a NULL user_id is a chain of one), ``chain_after``
the ones after it once it is done. A failed attempt moves the chain's later deliveries to its own
next try, so a chain waiting for a retry keeps them out of ``due``'s pages meanwhile.

Fairness: ``due`` takes at most ``per_webhook`` chains of each webhook, round-robin (each webhook's
first, then each one's second, ...), so one webhook's backlog never fills a page; it reads each
webhook's through the index deliveries_webhook_due, so another's backlog costs the read nothing.

Erasure: what ``due`` and ``chain_after`` return carries no event data. The deliverer reads a
delivery's data with ``event_data`` right before its POST starts, so a deletion that commits
before that read (store/writes.py's delete_player erases the names in the events' data) is what
the POST carries, however long the delivery waited in the deliverer's hands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Any

from authsvc.store.dialect import Dialect

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclasses.dataclass(frozen=True, slots=True)
class Due:
    """A pending delivery with what its POST needs: the webhook's URL and secret, the event."""

    id: int
    webhook_id: int
    user_id: int | None
    attempts: int
    created_at: int  # ms
    next_at: int  # ms
    url: str
    secret: str
    type: str
    at_ms: int  # the event's time
    more: bool = False  # whether the chain has pending deliveries after this one


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt (a delivery_attempts row) and the delivery's state after it."""

    delivery: Due
    at_ms: int
    status: int | None
    error: str | None
    duration_ms: int
    state: str  # PENDING (a retry at next_at), DELIVERED or FAILED
    next_at: int


def take_lease(
    conn: Any, d: Dialect, holder: str, now_ms: int, until_ms: int, dead: str | None = None
) -> str | None:
    """Hold the store's deliverer lease until ``until_ms`` if no one holds it, its holder's time ran
    out, it is ``holder``'s own, or ``dead``'s (a holder known to have stopped); None if so, else
    who holds it. One statement: of two deliverers taking it at once, one waits for the other's and
    then finds it held."""
    conn.execute(
        d.sql(
            "INSERT INTO deliverer_lease (id, holder, until_ms) VALUES (1, ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET holder = excluded.holder, until_ms = excluded.until_ms WHERE "
            "deliverer_lease.holder = excluded.holder OR deliverer_lease.until_ms < ? OR "
            "deliverer_lease.holder = ?"
        ),
        (holder, until_ms, now_ms, dead or ""),
    )
    found = conn.execute("SELECT holder FROM deliverer_lease").fetchone()[0]
    return None if found == holder else found


def lease(conn: Any, d: Dialect) -> tuple[str, int] | None:
    """(holder, until_ms) of the store's deliverer lease, None if no one holds it."""
    row = conn.execute("SELECT holder, until_ms FROM deliverer_lease").fetchone()
    return None if row is None else (row[0], row[1])


def release_lease(conn: Any, d: Dialect, holder: str) -> None:
    """Let the lease go, if ``holder``'s: another deliverer may take it at once."""
    conn.execute(d.sql("DELETE FROM deliverer_lease WHERE holder = ?"), (holder,))


# One delivery (pending, due now) per event in (mark, end] that the webhook subscribed to: its type;
# a game's event, that game or every game. The 24 hours run from the event (created_at).
_FAN_OUT = """INSERT INTO deliveries
(webhook_id, event_id, user_id, state, attempts, next_at, created_at)
SELECT w.id, e.id, e.user_id, 'pending', 0, ?, e.at_ms FROM webhooks AS w JOIN events AS e
ON (e.game_id IS NULL OR w.game_id IS NULL OR w.game_id = e.game_id) AND {subscribed}
WHERE w.id = ? AND e.id > ? AND e.id <= ? ORDER BY e.id"""


def fan_out(conn: Any, d: Dialect, now_ms: int, limit: int) -> tuple[int, bool]:
    """Each live webhook's deliveries of the events after its mark (``webhooks.fanned_out``), at
    most ``limit`` events a webhook, the mark moved past them; (deliveries written, whether events
    remain).

    Every event up to the highest id this reads is committed: events are written only under the
    writer lock (store/writes.py), so their ids are given in commit order, and a later change's
    event is never visible before an earlier one's (PostgreSQL's identity: no sequence cache). A
    webhook's mark is moved only from the value read (a second deliverer finds it moved and leaves
    that webhook), then its range is fanned out, so no event goes to a webhook twice."""
    upto = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
    hooks = conn.execute(
        d.sql(
            "SELECT id, fanned_out FROM webhooks WHERE deleted_at IS NULL AND fanned_out < ? "
            "ORDER BY id"
        ),
        (upto,),
    ).fetchall()
    written, more = 0, False
    for webhook_id, mark in hooks:
        end = min(upto, mark + limit)
        moved = conn.execute(
            d.sql(
                "UPDATE webhooks SET fanned_out = ? WHERE id = ? AND fanned_out = ? "
                "AND deleted_at IS NULL"
            ),
            (end, webhook_id, mark),
        ).rowcount
        if moved:
            written += conn.execute(
                d.sql(_FAN_OUT.format(subscribed=d.SUBSCRIBED)), (now_ms, webhook_id, mark, end)
            ).rowcount
            more = more or end < upto
    return written, more


_DUE = """
SELECT d.id, d.webhook_id, d.user_id, d.attempts, d.created_at, d.next_at, w.url, w.secret,
    e.type, e.at_ms,
    d.user_id IS NOT NULL AND EXISTS (SELECT 1 FROM deliveries AS f WHERE f.state = 'pending'
        AND f.webhook_id = d.webhook_id AND f.user_id = d.user_id AND f.id > d.id) AS more
FROM deliveries AS d JOIN webhooks AS w ON w.id = d.webhook_id JOIN events AS e ON e.id = d.event_id
"""

# One webhook's first due chain heads, by due time (the index deliveries_webhook_due: as many
# entries read as heads taken, plus the chains' later ones passed over).
_HEADS = (
    _DUE
    + """WHERE d.webhook_id = ? AND d.state = 'pending' AND d.next_at <= ?
AND NOT EXISTS (SELECT 1 FROM deliveries AS p
    WHERE p.state = 'pending' AND p.webhook_id = d.webhook_id AND p.user_id = d.user_id
    AND p.id < d.id)
ORDER BY d.next_at, d.id LIMIT ?"""
)


_FIELDS = [f.name for f in dataclasses.fields(Due)]


def _due(row: Any) -> Due:
    values = dict(zip(_FIELDS, row, strict=True))
    values["more"] = bool(values["more"])  # SQLite: 0 or 1
    return Due(**values)


def due(
    conn: Any, d: Dialect, now_ms: int, per_webhook: int, limit: int, skip: Collection[int] = ()
) -> list[Due]:
    """The first pending delivery of each chain, if due: at most ``per_webhook`` of each live
    webhook (but those of ``skip``), soonest first, each webhook's first before any webhook's
    second; at most ``limit``. One statement, a part per webhook."""
    hooks = [
        row[0]
        for row in conn.execute(
            "SELECT id FROM webhooks WHERE deleted_at IS NULL ORDER BY id"
        ).fetchall()
        if row[0] not in skip
    ]
    if not hooks:
        return []
    sql = " UNION ALL ".join(f"SELECT * FROM ({_HEADS}) AS w{n}" for n in range(len(hooks)))
    rows = conn.execute(d.sql(sql), [v for w in hooks for v in (w, now_ms, per_webhook)]).fetchall()
    rank: dict[int, int] = {}
    ranked = []
    for row in rows:
        item = _due(row)
        rank[item.webhook_id] = rank.get(item.webhook_id, 0) + 1
        ranked.append((rank[item.webhook_id], item.next_at, item.id, item))
    ranked.sort(key=lambda r: r[:3])
    return [r[3] for r in ranked[:limit]]


def event_data(conn: Any, d: Dialect, delivery_id: int) -> str | None:
    """The event's ``data`` (JSON) as it is now, for the delivery's POST about to start; None if the
    delivery is no longer pending or its webhook was removed (nothing to send)."""
    row = conn.execute(
        d.sql(
            "SELECT e.data FROM deliveries AS d JOIN events AS e ON e.id = d.event_id JOIN "
            "webhooks AS w ON w.id = d.webhook_id WHERE d.id = ? AND d.state = 'pending' AND "
            "w.deleted_at IS NULL"
        ),
        (delivery_id,),
    ).fetchone()
    return None if row is None else row[0]


def chain_after(conn: Any, d: Dialect, delivery: Due, now_ms: int, limit: int) -> list[Due]:
    """The chain's pending deliveries after ``delivery`` (done, its outcome not yet written), in
    order, up to the first that is not due."""
    if not delivery.more:
        return []
    rows = conn.execute(
        d.sql(
            _DUE + "WHERE d.state = 'pending' AND w.deleted_at IS NULL AND d.webhook_id = ? AND "
            "d.user_id = ? AND d.id > ? ORDER BY d.id LIMIT ?"
        ),
        (delivery.webhook_id, delivery.user_id, delivery.id, limit),
    ).fetchall()
    found = []
    for row in rows:
        later = _due(row)
        if later.next_at > now_ms:
            break
        found.append(later)
    return found


def record(conn: Any, d: Dialect, outcomes: Iterable[Outcome]) -> None:
    """Write attempts and the deliveries' new state; a retry moves the chain's later ones to its
    next try."""
    outcomes = list(outcomes)
    cur = conn.cursor()
    # n: the delivery's next attempt number, whatever a re-drive did to its ``attempts``.
    cur.executemany(
        d.sql(
            "INSERT INTO delivery_attempts (delivery_id, n, at, status, error, duration_ms) SELECT "
            "?, coalesce(max(n), 0) + 1, ?, ?, ?, ? FROM delivery_attempts WHERE delivery_id = ?"
        ),
        [
            (o.delivery.id, o.at_ms, o.status, o.error, o.duration_ms, o.delivery.id)
            for o in outcomes
        ],
    )
    cur.executemany(
        d.sql(
            "UPDATE deliveries SET attempts = attempts + 1, last_status = ?, last_error = ?, state "
            "= ?, next_at = ?, done_at = ? WHERE id = ? AND state = 'pending'"
        ),
        [
            (
                o.status,
                o.error,
                o.state,
                o.next_at,
                None if o.state == PENDING else o.at_ms,
                o.delivery.id,
            )
            for o in outcomes
        ],
    )
    later = [
        (o.next_at, o.delivery.webhook_id, o.delivery.user_id, o.delivery.id, o.next_at)
        for o in outcomes
        if o.state == PENDING and o.delivery.user_id is not None
    ]
    if later:
        cur.executemany(
            d.sql(
                "UPDATE deliveries SET next_at = ? WHERE state = 'pending' AND webhook_id = ? AND "
                "user_id = ? AND id > ? AND next_at < ?"
            ),
            later,
        )


def backlog(conn: Any, d: Dialect) -> list[tuple[int, int, int, int | None]]:
    """Per live webhook: (id, pending, failed, the oldest pending one's created_at or None), for the
    deliverer's metrics at each scrape. One statement: pending through deliveries_webhook_due,
    failed through deliveries_webhook (the webhook's rows kept, AUTHSVC_WEBHOOK_RETENTION)."""
    return [
        tuple(row)
        for row in conn.execute(
            "SELECT w.id, (SELECT count(*) FROM deliveries AS p WHERE p.webhook_id = w.id AND "
            "p.state = 'pending'), (SELECT count(*) FROM deliveries AS f WHERE f.webhook_id = w.id "
            "AND f.state = 'failed'), (SELECT min(o.created_at) FROM deliveries AS o WHERE "
            "o.webhook_id = w.id AND o.state = 'pending') FROM webhooks AS w WHERE w.deleted_at IS "
            "NULL ORDER BY w.id"
        ).fetchall()
    ]


def fail_orphans(conn: Any, d: Dialect, now_ms: int) -> int:
    """Pending deliveries of deleted webhooks become failed; how many."""
    return conn.execute(
        d.sql(
            "UPDATE deliveries SET state = 'failed', done_at = ?, last_error = 'the webhook was "
            "deleted' WHERE state = 'pending' AND webhook_id IN (SELECT id FROM webhooks WHERE "
            "deleted_at IS NOT NULL)"
        ),
        (now_ms,),
    ).rowcount


def prune(conn: Any, d: Dialect, before_ms: int, limit: int) -> tuple[int, int, int]:
    """Delete at most ``limit`` deliveries done (delivered or failed) before ``before_ms``, with
    their attempts, at most ``limit`` events from before it that no delivery row needs and every
    live webhook has fanned out, and the rows of webhooks removed before it that no delivery row
    names (their secrets are zeroed already); (deliveries, events, webhooks).

    The rows are picked first, then each is deleted only if still so: a failed delivery re-driven in
    between (pending again) stays, with its attempts. An event's time never runs backwards along its
    ids (the writer lock, store/writes.py), so the events before ``before_ms`` are a prefix of
    them."""
    done = [
        row[0]
        for row in conn.execute(
            d.sql(
                "SELECT id FROM deliveries WHERE state <> 'pending' AND done_at < ? ORDER BY "
                "done_at LIMIT ?"
            ),
            (before_ms, limit),
        ).fetchall()
    ]
    cur = conn.cursor()
    cur.executemany(
        d.sql("DELETE FROM deliveries WHERE id = ? AND state <> 'pending' AND done_at < ?"),
        [(delivery_id, before_ms) for delivery_id in done],
    )
    deleted = cur.rowcount if done else 0
    cur.executemany(
        d.sql(
            "DELETE FROM delivery_attempts WHERE delivery_id = ? "
            "AND NOT EXISTS (SELECT 1 FROM deliveries WHERE id = ?)"
        ),
        [(delivery_id, delivery_id) for delivery_id in done],
    )
    newer = conn.execute(
        d.sql("SELECT id FROM events WHERE at_ms >= ? ORDER BY id LIMIT 1"), (before_ms,)
    ).fetchone()
    marked = conn.execute(
        "SELECT min(fanned_out) FROM webhooks WHERE deleted_at IS NULL"
    ).fetchone()[0]
    unneeded = [
        row[0]
        for row in conn.execute(
            d.sql(
                "SELECT e.id FROM events AS e WHERE e.id < ? AND e.id <= ? AND NOT EXISTS (SELECT "
                "1 FROM deliveries AS d WHERE d.event_id = e.id) ORDER BY e.id LIMIT ?"
            ),
            (newer[0] if newer else 1 << 62, 1 << 62 if marked is None else marked, limit),
        ).fetchall()
    ]
    cur.executemany(
        d.sql("DELETE FROM events WHERE id = ?"), [(event_id,) for event_id in unneeded]
    )
    removed = conn.execute(
        d.sql(
            "DELETE FROM webhooks WHERE deleted_at < ? AND NOT EXISTS (SELECT 1 FROM deliveries "
            "WHERE webhook_id = webhooks.id)"
        ),
        (before_ms,),
    ).rowcount
    return deleted, len(unneeded), removed
