"""``authsvc webhook add | list | remove | deliveries | retry``: webhook subscriptions and their
deliveries (docs/admin.md, "Webhooks").

The same operations, rules and audit records as the admin API's ``/v1/webhooks``, and with
``--json`` the same shapes; ``add`` prints the signing secret once.
"""

from __future__ import annotations

import argparse

from authsvc.api.routes import delivery_json, webhook_json
from authsvc.errors import Invalid
from authsvc.operations import webhooks as webhooks_ops
from authsvc.operations.context import admin_store, at_ms, command_context
from authsvc.store.events import DELIVERY_STATES, EVENT_TYPES

# The admin API's body fields as this command's arguments, for its error lines.
_ARGUMENTS = {"/url": "URL", "/events": "--event", "/game_id": "--game"}


def cmd_add(args, settings):
    try:
        webhooks_ops.check_webhook_request(
            args.url, args.event, args.game, settings.webhook_allow_hosts
        )  # before the store
        with admin_store(settings) as store:
            hook, secret = webhooks_ops.add_webhook(
                store,
                command_context(),
                args.url,
                args.event,
                args.game,
                settings.webhook_allow_hosts,
                settings.max_webhooks,
            )
    except Invalid as e:
        if e.field not in _ARGUMENTS:
            raise
        raise Invalid(f"{_ARGUMENTS[e.field]} {e.detail}") from None
    text = (
        f"webhook {hook.id} created: {hook.url}, events {' '.join(hook.events)}"
        f"{'' if hook.game_id is None else f', game {hook.game_id}'}\n"
        f"secret: {secret}\n"
        "The secret is shown only this once: give it to the receiver to verify signatures with."
    )
    return 0, webhook_json(hook) | {"secret": secret}, text


def cmd_list(args, settings):
    with admin_store(settings) as store:
        hooks = webhooks_ops.list_webhooks(store)
    lines = [f"{'ID':>6}  {'GAME':>6}  {'URL':40}  EVENTS"]
    for h in hooks:
        lines.append(
            f"{h.id:>6}  {'-' if h.game_id is None else h.game_id:>6}  {h.url:40}  "
            f"{' '.join(h.events)}"
        )
    return 0, {"webhooks": [webhook_json(h) for h in hooks]}, "\n".join(lines)


def cmd_remove(args, settings):
    with admin_store(settings) as store:
        hook = webhooks_ops.remove_webhook(store, command_context(), args.id)
    return (
        0,
        {"id": hook.id, "deleted": True},
        f"webhook {hook.id} removed; its pending deliveries will not be sent",
    )


def _delivery_line(d) -> str:
    last = d.last_error or ("" if d.last_status is None else f"HTTP {d.last_status}")
    when = at_ms(d.next_at if d.state == "pending" else d.done_at) or ""
    user = "-" if d.user_id is None else d.user_id
    return (
        f"{d.id:>8}  {d.event_type:18}  {user:>10}  {d.state:9}  {d.attempts:>5}  {when:24}  {last}"
    )


def cmd_deliveries(args, settings):
    with admin_store(settings) as store:
        found = webhooks_ops.webhook_deliveries(store, args.id, args.state, args.limit, args.after)
    next_cursor = str(found[-1].id) if len(found) == args.limit else None
    lines = [
        f"{'ID':>8}  {'EVENT':18}  {'USER':>10}  {'STATE':9}  {'TRIES':>5}  "
        f"{'NEXT (PENDING) OR DONE':24}  LAST ANSWER"
    ]
    lines += [_delivery_line(d) for d in found]
    if next_cursor is not None:
        lines.append(f"more: --after {next_cursor}")
    return (
        0,
        {"deliveries": [delivery_json(d) for d in found], "next": next_cursor},
        "\n".join(lines),
    )


def cmd_retry(args, settings):
    if (args.delivery_id is None) == (not args.all) or (args.state and not args.all):
        raise Invalid("give a DELIVERY_ID, or --all (and --state) for every pending and failed one")
    with admin_store(settings) as store:
        if args.all:
            count = webhooks_ops.retry_deliveries(store, command_context(), args.id, args.state)
            which = f"{args.state} deliveries" if args.state else "pending and failed deliveries"
            return (
                0,
                {"webhook_id": args.id, "due_now": count},
                f"webhook {args.id}: {count} {which} due now",
            )
        d = webhooks_ops.retry_delivery(store, command_context(), args.id, args.delivery_id)
    return 0, delivery_json(d), f"delivery {d.id} of webhook {args.id} is pending again, due now"


def _page_size(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= webhooks_ops.MAX_DELIVERY_PAGE):
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {webhooks_ops.MAX_DELIVERY_PAGE}"
        )
    return int(text)


def add_parsers(top, common, parser_class) -> None:
    sub = top.add_parser("webhook", help="webhook subscriptions to events").add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=parser_class
    )

    def leaf(name, func, text):
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=func)
        return p

    p = leaf("add", cmd_add, "subscribe a URL to events; prints the signing secret (once)")
    p.add_argument("url", metavar="URL")
    p.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="TYPE",
        choices=EVENT_TYPES,
        required=True,
        help=f"an event type to send (repeat): {', '.join(EVENT_TYPES)}",
    )
    p.add_argument(
        "--game",
        type=int,
        metavar="ID",
        help="only this game's game.key_rotated (default: every game's)",
    )
    leaf("list", cmd_list, "list the webhooks (never their secrets)")
    leaf("remove", cmd_remove, "end a webhook: its pending deliveries are not sent").add_argument(
        "id", type=int
    )
    p = leaf(
        "deliveries",
        cmd_deliveries,
        "a webhook's deliveries, oldest first, with their state and last error",
    )
    p.add_argument("id", type=int)
    p.add_argument("--state", choices=DELIVERY_STATES, help="only those in this state")
    p.add_argument(
        "--limit", type=_page_size, default=100, metavar="N", help="at most N (default 100)"
    )
    p.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="ID",
        help="those after this delivery id (the next page)",
    )
    p = leaf(
        "retry",
        cmd_retry,
        "send a failed delivery again (another 24 hours of attempts); --all: every "
        "pending and failed one now, after a receiver's outage",
    )
    p.add_argument("id", type=int)
    p.add_argument("delivery_id", type=int, metavar="DELIVERY_ID", nargs="?")
    p.add_argument(
        "--all",
        action="store_true",
        help="every pending and failed delivery of the webhook, due now",
    )
    p.add_argument(
        "--state", choices=webhooks_ops.RETRY_STATES, help="with --all: only those in this state"
    )
