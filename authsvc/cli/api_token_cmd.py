"""``authsvc api-token add | list | revoke``: the admin API's bearer tokens (docs/admin.md, "Admin
API tokens").

``add`` prints the token once; the store keeps its digest (authsvc/operations/api_tokens.py).
"""

from __future__ import annotations

from authsvc import times
from authsvc.operations import api_tokens
from authsvc.operations import api_tokens as api_tokens_ops
from authsvc.operations.context import admin_store, command_context


def _when(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    return times.utc(seconds * 1000, millis=False)


def cmd_add(args, settings):
    api_tokens_ops.check_api_token_request(
        args.name, args.scope, args.expires_in
    )  # before the store is opened, as ever
    with admin_store(settings) as store:
        row, token = api_tokens_ops.add_api_token(
            store, command_context(), args.name, args.scope, args.expires_in
        )
    obj = row.as_json() | {"token": token}
    text = (
        f"api token {row.name} created, scopes {' '.join(row.scopes)}, expires "
        f"{_when(row.expires_at)}\ntoken: {token}\n"
        "The token is shown only this once: put it in the web tier's secret store now."
    )
    return 0, obj, text


def cmd_list(args, settings):
    with admin_store(settings) as store:
        rows = api_tokens_ops.list_api_tokens(store)
    lines = [f"{'NAME':24}  {'EXPIRES':20}  {'REVOKED':20}  SCOPES"]
    for r in rows:
        lines.append(
            f"{r.name:24}  {_when(r.expires_at):20}  {_when(r.revoked_at):20}  {' '.join(r.scopes)}"
        )
    return 0, {"api_tokens": [r.as_json() for r in rows]}, "\n".join(lines)


def cmd_revoke(args, settings):
    with admin_store(settings) as store:
        row = api_tokens_ops.revoke_api_token(store, command_context(), args.name)
    return 0, row.as_json(), f"api token {row.name} revoked"


def add_parsers(top, common, parser_class) -> None:
    sub = top.add_parser("api-token", help="the admin API's bearer tokens").add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=parser_class
    )

    def leaf(name, func, text):
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=func)
        return p

    p = leaf("add", cmd_add, "make an admin API token; prints it (once)")
    p.add_argument("name")
    p.add_argument(
        "--scope",
        action="append",
        default=[],
        metavar="SCOPE",
        choices=api_tokens.SCOPES,
        help=f"a scope it grants (repeat): {', '.join(api_tokens.SCOPES)}",
    )
    p.add_argument(
        "--expires-in", type=int, metavar="SECONDS", help="stop working this many seconds from now"
    )
    leaf("list", cmd_list, "list admin API tokens (never the tokens themselves)")
    leaf("revoke", cmd_revoke, "stop an admin API token at once").add_argument("name")
