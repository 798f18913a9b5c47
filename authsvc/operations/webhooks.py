"""Webhook subscriptions and their deliveries (store/events.py, authsvc/webhooks/target.py;
docs/admin.md, "Webhooks").
"""

from __future__ import annotations

from authsvc.errors import Conflict, Invalid, NotFound
from authsvc.names import MAX_ID
from authsvc.operations.context import Context
from authsvc.settings import (
    default,
    host_list,
)
from authsvc.store.base import Store
from authsvc.store.events import DELIVERY_STATES, EVENT_TYPES, Delivery, Webhook
from authsvc.tokens import (
    new_webhook_secret,
)
from authsvc.webhooks.target import check_url

MAX_DELIVERY_PAGE = 500


def _id(value: int, what: str, field: str | None = None) -> int:
    if type(value) is not int or not 1 <= value <= MAX_ID:
        raise Invalid(f"{what} must be a whole number from 1 to 2^63-1", field=field)
    return value


def check_webhook_request(
    url: str, events: list[str], game_id: int | None, allow_hosts: str
) -> tuple[str, ...]:
    """The rules of a new subscription but the game's existence; returns its event types, sorted,
    once each."""
    check_url(url, host_list(allow_hosts))
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise Invalid(
            f"must list one or more event types, from: {', '.join(EVENT_TYPES)}", field="/events"
        )
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise Invalid(
            f"has an unknown event type; the types are: {', '.join(EVENT_TYPES)}", field="/events"
        )
    if game_id is not None:
        _id(game_id, "a game id", "/game_id")
    return tuple(sorted(set(events)))


def add_webhook(
    store: Store,
    ctx: Context,
    url: str,
    events: list[str],
    game_id: int | None,
    allow_hosts: str,
    max_webhooks: int = default("max_webhooks"),
) -> tuple[Webhook, str]:
    """A new subscription: (webhook, secret). The secret is shown once; its record holds the URL,
    never it. At most ``max_webhooks`` (AUTHSVC_MAX_WEBHOOKS) live ones, counted under the writer
    lock: each is a POST of every event it is subscribed to, kept for the retention."""
    chosen = check_webhook_request(url, events, game_id, allow_hosts)
    secret = new_webhook_secret()
    with store.write(ctx.audit()) as tx:
        if game_id is not None and tx.game(game_id) is None:
            raise Invalid(f"no game {game_id}", field="/game_id")
        if (live := tx.webhook_count()) >= max_webhooks:
            raise Conflict(
                f"the store has {live} webhooks, its limit (AUTHSVC_MAX_WEBHOOKS): remove one first"
            )
        return tx.add_webhook(url, chosen, game_id, secret), secret


def list_webhooks(store: Store) -> list[Webhook]:
    return store.webhooks()


def get_webhook(store: Store, webhook_id: int) -> Webhook:
    found = store.webhooks(_id(webhook_id, "a webhook id"))
    if not found:
        raise NotFound(f"no webhook {webhook_id}")
    return found[0]


def remove_webhook(store: Store, ctx: Context, webhook_id: int) -> Webhook:
    """The subscription ends: no new deliveries, its pending ones fail ("webhook removed")."""
    with store.write(ctx.audit()) as tx:
        hook = tx.remove_webhook(_id(webhook_id, "a webhook id"))
    if hook is None:
        raise NotFound(f"no webhook {webhook_id}")
    return hook


def webhook_deliveries(
    store: Store, webhook_id: int, state: str | None = None, limit: int = 100, after: int = 0
) -> list[Delivery]:
    """A page of the webhook's deliveries, oldest first, each with its attempts; a removed webhook's
    too, until retention deletes them (and then its row)."""
    if not store.webhooks(_id(webhook_id, "a webhook id"), removed=True):
        raise NotFound(f"no webhook {webhook_id}")
    if state is not None and state not in DELIVERY_STATES:
        raise Invalid(f"must be one of: {', '.join(DELIVERY_STATES)}", field="state")
    return store.deliveries(webhook_id, state=state, limit=limit, after=after)


def retry_delivery(store: Store, ctx: Context, webhook_id: int, delivery_id: int) -> Delivery:
    """A failed delivery sent again: pending, due now, its 24 hours of attempts starting again."""
    with store.write(ctx.audit()) as tx:
        if tx.webhook(_id(webhook_id, "a webhook id")) is None:
            raise NotFound(f"no webhook {webhook_id}")
        current = tx.delivery(webhook_id, _id(delivery_id, "a delivery id"))
        if current is None:
            raise NotFound(f"no delivery {delivery_id} of webhook {webhook_id}")
        retried = tx.retry_delivery(webhook_id, delivery_id)
    if retried is None:
        raise Conflict(
            f"delivery {delivery_id} is {current.state}: only a failed one is sent again"
        )
    return retried


# The states of the deliveries that ``retry_deliveries`` makes due now.
RETRY_STATES = ("pending", "failed")


def retry_deliveries(store: Store, ctx: Context, webhook_id: int, state: str | None = None) -> int:
    """After a receiver's outage: the webhook's pending deliveries (``state`` "pending"), its failed
    ones ("failed"), or both (None) due now; how many were made so."""
    if state is not None and state not in RETRY_STATES:
        raise Invalid(f"must be one of: {', '.join(RETRY_STATES)}", field="state")
    with store.write(ctx.audit()) as tx:
        hook = tx.webhook(_id(webhook_id, "a webhook id"))
        if hook is None:
            raise NotFound(f"no webhook {webhook_id}")
        return tx.retry_deliveries(hook, RETRY_STATES if state is None else (state,))
