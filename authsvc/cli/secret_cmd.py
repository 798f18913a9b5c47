"""``authsvc secret rotate | retire | list``: the token secret file, changed with no restart
(docs/tokens.md, "Rotation"; docs/operations.md, "Rotate the token secret").

Every running process re-reads the file within AUTHSVC_MAX_STALENESS; the store keeps each secret's
fingerprint (authsvc/tokens.py), never a secret, and no output shows one.
"""

from __future__ import annotations

from authsvc import times
from authsvc.operations import token_secret
from authsvc.operations.context import admin_store, command_context


def _when(seconds: int | None) -> str:
    if seconds is None:
        return "not recorded in the store"
    return times.utc(seconds * 1000, millis=False)


def cmd_rotate(args, settings):
    path = settings.token_secret_file
    with admin_store(settings) as store:
        older = token_secret.rotate_token_secret(store, command_context(), path)
    text = (
        f"token secret file {path}: a new secret, minted with from now on by every process within "
        f"a second; the {older} older one(s) still accepted.\n"
        "Tokens minted before keep working until you retire the older secrets: run 'authsvc secret "
        "retire' once the platform has minted a new token for every player still playing (it mints "
        "one at each player's next page load: wait out your longest session, a day is typical). "
        f"Copy {path} to its backup now."
    )
    return 0, {"token_secret_file": path, "older_secrets": older}, text


def cmd_retire(args, settings):
    path = settings.token_secret_file
    with admin_store(settings) as store:
        retired = token_secret.retire_token_secrets(store, command_context(), path)
    text = (
        f"token secret file {path}: {retired} older secret(s) retired; the tokens minted with them "
        "are refused within a second. Copy the file to its backup now."
        if retired
        else f"token secret file {path}: only the current secret, nothing to retire"
    )
    return 0, {"token_secret_file": path, "retired": retired}, text


def cmd_list(args, settings):
    path = settings.token_secret_file
    with admin_store(settings) as store:
        rows = token_secret.list_token_secrets(store, path)
    lines = [f"{'#':>2}  {'USE':14}  {'FINGERPRINT':12}  RECORDED"]
    for r in rows:
        use = "minted with" if r["minted_with"] else "accepted"
        lines.append(
            f"{r['position']:>2}  {use:14}  {r['fingerprint']:12}  {_when(r['recorded_at'])}"
        )
    return 0, {"token_secret_file": path, "secrets": rows}, "\n".join(lines)


def add_parsers(top, common, parser_class) -> None:
    sub = top.add_parser(
        "secret", help="the token secret file: rotate, retire, list"
    ).add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=parser_class)

    def leaf(name, func, text):
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=func)
        return p

    leaf(
        "rotate",
        cmd_rotate,
        "add a new token secret and mint with it; the older ones stay accepted (no restart)",
    )
    leaf(
        "retire",
        cmd_retire,
        "drop every token secret but the current one: the tokens minted with them are refused",
    )
    leaf(
        "list",
        cmd_list,
        "the token secrets in the file, as fingerprints (never a secret), and when each was "
        "recorded",
    )
