"""``authsvc webhook add | list | remove``: webhook subscriptions (docs/admin.md, "Webhooks").

The same operations, rules and audit records as the admin API's ``/v1/webhooks``; ``add`` prints
the signing secret once.
"""

from __future__ import annotations

from authsvc.admin import operations as ops
from authsvc.errors import Invalid
from authsvc.store.events import EVENT_TYPES

# The admin API's body fields as this command's arguments, for its error lines.
_ARGUMENTS = {"/url": "URL", "/events": "--event", "/game_id": "--game"}


def _json(hook) -> dict:
    return {"id": hook.id, "url": hook.url, "events": list(hook.events), "game_id": hook.game_id,
            "created_at": ops.at_ms(hook.created_at)}


def cmd_add(args, settings):
    try:
        ops.check_webhook_request(args.url, args.event, args.game, settings.webhook_allow_hosts)  # before the store
        with ops.admin_store(settings) as store:
            hook, secret = ops.add_webhook(store, ops.command_context(), args.url, args.event, args.game,
                                           settings.webhook_allow_hosts)
    except Invalid as e:
        if e.field not in _ARGUMENTS:
            raise
        raise Invalid(f"{_ARGUMENTS[e.field]} {e.detail}") from None
    text = (f"webhook {hook.id} created: {hook.url}, events {' '.join(hook.events)}"
            f"{'' if hook.game_id is None else f', game {hook.game_id}'}\n"
            f"secret: {secret}\n"
            "The secret is shown only this once: give it to the receiver to verify signatures with.")
    return 0, _json(hook) | {"secret": secret}, text


def cmd_list(args, settings):
    with ops.admin_store(settings) as store:
        hooks = ops.list_webhooks(store)
    lines = [f"{'ID':>6}  {'GAME':>6}  {'URL':40}  EVENTS"]
    for h in hooks:
        lines.append(f"{h.id:>6}  {'-' if h.game_id is None else h.game_id:>6}  {h.url:40}  {' '.join(h.events)}")
    return 0, {"webhooks": [_json(h) for h in hooks]}, "\n".join(lines)


def cmd_remove(args, settings):
    with ops.admin_store(settings) as store:
        hook = ops.remove_webhook(store, ops.command_context(), args.id)
    return 0, {"id": hook.id, "deleted": True}, f"webhook {hook.id} removed; its pending deliveries will not be sent"


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
    p.add_argument("--event", action="append", default=[], metavar="TYPE", choices=EVENT_TYPES, required=True,
                   help=f"an event type to send (repeat): {', '.join(EVENT_TYPES)}")
    p.add_argument("--game", type=int, metavar="ID", help="only this game's game.key_rotated (default: every game's)")
    leaf("list", cmd_list, "list the webhooks (never their secrets)")
    leaf("remove", cmd_remove, "end a webhook: its pending deliveries are not sent").add_argument("id", type=int)
