"""The ``authsvc`` admin command (docs/admin.md). Its subcommands:

    init
    game add | list | enable | disable | rotate-key
    player add | show | rename | enable | disable | revoke | delete | deleted | import
    token issue
    secret rotate | retire | list
    api-token add | list | revoke
    webhook add | list | remove | deliveries | retry
    audit [filters] | verify | prune
    export, import, backup, restore, check, explain
    heartbeat (a long-running writer for hot standbys: authsvc/cli/heartbeat.py)
    deliver (a long-running sender of the events to their webhooks: authsvc/webhooks/deliver.py)

Every subcommand takes ``--json`` (one JSON object on stdout). Bad input gives a
one-line message on stderr and exit 1 (exit 2 for a malformed command line).
The web process never writes; this command and the admin API are the store's writers. This
module parses arguments and prints; every write and its audit record go through
the operations layer (authsvc/operations/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from authsvc import release, times
from authsvc.cli import api_token_cmd, audit_cmd, secret_cmd, setup_cmd, webhook_cmd
from authsvc.errors import CommandError, Error
from authsvc.names import check_game_name, check_username, shown
from authsvc.operations import games as games_ops
from authsvc.operations import players as players_ops
from authsvc.operations import stores, tokens
from authsvc.operations import token_secret as token_secret_ops
from authsvc.operations.context import MAX_OLD_KEY_TTL, admin_store, command_context
from authsvc.settings import Settings
from authsvc.store import redact_url
from authsvc.store.base import Game
from authsvc.web.authenticate import parse_user_id

__all__ = ["MAX_OLD_KEY_TTL", "build_parser", "main"]


# -- helpers ------------------------------------------------------------------------------


def user_id_arg(text: str) -> int:
    user_id = parse_user_id(text)
    if user_id is None:
        raise argparse.ArgumentTypeError(
            f"user id must be a whole number from 1 to 2^63-1, got {text!r}"
        )
    return user_id


def game_id_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit() and text[0] != "0"):
        raise argparse.ArgumentTypeError(f"game id must be a positive whole number, got {text!r}")
    return int(text)


def game_json(game: Game) -> dict:
    return {
        "game_id": game.id,
        "name": game.name,
        "enabled": game.enabled,
        "created_at": game.created_at,
        "keys": [{"created_at": k.created_at, "expires_at": k.expires_at} for k in game.keys],
    }


# -- subcommands --------------------------------------------------------------------------
# Each takes (args, settings) and returns (exit status, json object, human text).


_SECRET_OUTCOMES = {
    "kept": "exists, kept",
    "created": "created (mode 0600), its fingerprint recorded in the store",
    "adopted": "exists, kept; its secrets' fingerprints recorded in the store (a store from before "
    "them)",
    "new": "a NEW secret written (mode 0600): every token issued before is refused from now on; "
    "the platform must mint new ones",
}


def cmd_init(args, settings: Settings):
    path = settings.token_secret_file
    before, after, secret = stores.initialize(
        settings, command_context(), new_secret=args.new_secret
    )
    obj = {
        "store": redact_url(settings.store),
        "schema_version_before": before,
        "schema_version": after,
        "token_secret_file": path,
        "token_secret_created": secret in ("created", "new"),
        "token_secret": secret,
    }
    text = (
        f"store {redact_url(settings.store)}: schema version {after}"
        + (f" (migrated from {before})" if before != after else " (up to date)")
        + f"\ntoken secret {path}: "
        + _SECRET_OUTCOMES[secret]
    )
    return 0, obj, text


def cmd_game_add(args, settings):
    check_game_name(args.name)  # before the store is opened, as ever
    with _store(settings) as store:
        game, api_key = games_ops.add_game(store, command_context(), args.name)
    obj = {"game_id": game.id, "name": game.name, "api_key": api_key}
    text = (
        f"game {game.id} ({shown(game.name)}) created\napi key: {api_key}\n"
        "The key is shown only this once: give it to the game's server operator now."
    )
    return 0, obj, text


def cmd_game_list(args, settings):
    with _store(settings) as store:
        games = games_ops.list_games(store)
    now = int(time.time())
    lines = [f"{'ID':>6}  {'ENABLED':7}  {'LIVE KEYS':9}  NAME"]
    for g in games:
        live = sum(1 for k in g.keys if k.expires_at is None or k.expires_at > now)
        lines.append(f"{g.id:>6}  {'yes' if g.enabled else 'no':7}  {live:>9}  {shown(g.name)}")
    return 0, {"games": [game_json(g) for g in games]}, "\n".join(lines)


def cmd_game_enable(args, settings):
    enabled = args.action == "enable"
    with _store(settings) as store:
        games_ops.set_game_enabled(store, command_context(), args.game_id, enabled)
    return 0, {"game_id": args.game_id, "enabled": enabled}, f"game {args.game_id} {args.action}d"


def cmd_game_rotate_key(args, settings):
    ctx = command_context()
    games_ops.check_old_key_ttl(args.old_key_ttl)  # before the store is opened, as ever
    with _store(settings) as store:
        api_key, expires_at = games_ops.rotate_game_key(store, ctx, args.game_id, args.old_key_ttl)
    obj = {"game_id": args.game_id, "api_key": api_key, "old_keys_expire_at": expires_at}
    text = (
        f"new api key for game {args.game_id}: {api_key}\n"
        "older keys stop working at "
        f"{times.utc(expires_at * 1000, millis=False, sep=' ', zone=' UTC')}\n"
        "The key is shown only this once."
    )
    return 0, obj, text


def _player_json(player) -> dict:
    return {
        "user_id": player.user_id,
        "username": player.username,
        "epoch": player.epoch,
        "enabled": player.enabled,
        "updated_at": players_ops.updated_at(player),
    }


def cmd_player_add(args, settings):
    check_username(args.username)  # before the store is opened, as ever
    with _store(settings) as store:
        player = players_ops.add_player(store, command_context(), args.user_id, args.username)
    return 0, _player_json(player), f"player {player.user_id} ({shown(player.username)}) added"


def cmd_player_show(args, settings):
    with _store(settings) as store:
        player = players_ops.get_player(store, args.user_id)
    text = (
        f"player {player.user_id}: {shown(player.username)}, epoch {player.epoch}, "
        + ("enabled" if player.enabled else "disabled")
        + (
            f", last changed {players_ops.updated_at(player)}"
            if player.updated_at_ms is not None
            else ", last changed: unknown (before updated_at was recorded)"
        )
    )
    return 0, _player_json(player), text


def cmd_player_rename(args, settings):
    check_username(args.username)
    with _store(settings) as store:
        username = players_ops.rename_player(store, command_context(), args.user_id, args.username)
    return (
        0,
        {"user_id": args.user_id, "username": username},
        f"player {args.user_id} renamed to {shown(username)}",
    )


def cmd_player_enable(args, settings):
    enabled = args.action == "enable"
    with _store(settings) as store:
        players_ops.set_player_enabled(store, command_context(), args.user_id, enabled)
    return 0, {"user_id": args.user_id, "enabled": enabled}, f"player {args.user_id} {args.action}d"


def cmd_player_revoke(args, settings):
    with _store(settings) as store:
        epoch = players_ops.revoke_player(store, command_context(), args.user_id)
    text = f"player {args.user_id}: every token revoked (credential epoch now {epoch})"
    return 0, {"user_id": args.user_id, "epoch": epoch}, text


def cmd_player_delete(args, settings):
    with _store(settings) as store:
        players_ops.delete_player(store, command_context(), args.user_id)
    text = (
        f"player {args.user_id} deleted: every token refused, its names erased from the store "
        "and the audit trail"
    )
    return 0, {"user_id": args.user_id, "deleted": True}, text


def cmd_player_deleted(args, settings):
    since_ms = audit_cmd.parse_time(args.since, round(command_context().clock() * 1000))
    with _store(settings) as store:
        ids = players_ops.deleted_since(store, since_ms)
    return 0, {"since": times.utc(since_ms), "user_ids": ids}, "\n".join(str(i) for i in ids)


def cmd_player_import(args, settings):
    try:
        f = open(args.file, "rb")
    except OSError as e:
        raise CommandError(f"cannot read {args.file}: {e.strerror}") from None
    with f, _store(settings) as store:
        data = f.read()
        total = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
        bar = ProgressBar(total) if sys.stderr.isatty() and not args.json else None
        started = time.monotonic()
        count = players_ops.import_players(store, command_context(), data, progress=bar)
        if bar:
            bar.done(count)
    seconds = time.monotonic() - started
    return (
        0,
        {"rows": count, "seconds": round(seconds, 3)},
        f"imported {count} players in {seconds:.1f} s",
    )


def cmd_token_issue(args, settings):
    with _store(settings) as store:
        secret = token_secret_ops.token_secrets(store, settings)[0]
        token, player = tokens.mint(store, command_context(), secret, args.game, args.user)
    return 0, {"game_id": args.game, "user_id": player.user_id, "game_auth_token": token}, token


def cmd_export(args, settings):
    with _store(settings) as store:
        games, players = stores.export_store(store, args.file)
    return (
        0,
        {"file": args.file, "games": games, "players": players},
        (f"exported {games} games and {players} players to {args.file}"),
    )


def cmd_import(args, settings):
    started = time.monotonic()
    with _store(settings) as store:
        games, players = stores.import_store(store, command_context(), args.file)
    seconds = time.monotonic() - started
    return (
        0,
        {"file": args.file, "games": games, "players": players, "seconds": round(seconds, 3)},
        (f"imported {games} games and {players} players from {args.file} in {seconds:.1f} s"),
    )


# -- plumbing ------------------------------------------------------------------------------

# ``with _store(settings) as store``: an admin (read-write) store, closed afterwards
_store = admin_store


class ProgressBar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int):
        self.total = max(total, 1)
        self.last = 0.0

    def __call__(self, count: int) -> None:
        now = time.monotonic()
        if now - self.last >= 0.1:
            self.last = now
            self.draw(count, self.total)

    def draw(self, count: int, total: int) -> None:
        share = min(count / max(total, 1), 1.0)
        filled = int(share * 30)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {share:4.0%} {count}/{total}")
        sys.stderr.flush()

    def done(self, count: int) -> None:
        """The final state: the total was a line count (header, blank lines), the rows are exact."""
        self.draw(count, count)
        sys.stderr.write("\n")


class _Parser(argparse.ArgumentParser):
    """No abbreviated options: `--api-key SECRET` must never be taken for `--api-key-file
    SECRET`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message.startswith(
            "unrecognized arguments:"
        ):  # a stray argument may be a secret: never repeated
            message = "unrecognized arguments (not repeated here)"
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    parser = _Parser(
        prog="authsvc", description="Admin command of the player-authentication service."
    )
    parser.add_argument("--version", action="version", version=f"authsvc {release()}")
    top = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def leaf(parent, name, func, help_text):
        p = parent.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = leaf(
        top, "init", cmd_init, "create or migrate the store and create the token secret if missing"
    )
    p.add_argument(
        "--new-secret",
        action="store_true",
        help="write a new token secret even though the store has players: every token issued is "
        "refused",
    )

    game = top.add_parser("game", help="games and their api keys").add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=_Parser
    )
    leaf(game, "add", cmd_game_add, "add a game; prints its id and api key (once)").add_argument(
        "name"
    )
    leaf(game, "list", cmd_game_list, "list games")
    for action in ("enable", "disable"):
        leaf(game, action, cmd_game_enable, f"{action} a game").add_argument(
            "game_id", type=game_id_arg
        )
    p = leaf(
        game, "rotate-key", cmd_game_rotate_key, "give a game a new api key; older keys expire"
    )
    p.add_argument("game_id", type=game_id_arg)
    p.add_argument(
        "--old-key-ttl",
        type=int,
        default=86400,
        metavar="SECONDS",
        help="seconds until the game's older keys stop working (default 86400)",
    )

    player = top.add_parser("player", help="players").add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=_Parser
    )
    p = leaf(player, "add", cmd_player_add, "add a player")
    p.add_argument("user_id", type=user_id_arg)
    p.add_argument("username")
    leaf(player, "show", cmd_player_show, "show a player").add_argument("user_id", type=user_id_arg)
    p = leaf(player, "rename", cmd_player_rename, "change a player's username")
    p.add_argument("user_id", type=user_id_arg)
    p.add_argument("username")
    for action in ("enable", "disable"):
        leaf(player, action, cmd_player_enable, f"{action} a player").add_argument(
            "user_id", type=user_id_arg
        )
    leaf(
        player, "revoke", cmd_player_revoke, "revoke every token of a player (password change)"
    ).add_argument("user_id", type=user_id_arg)
    leaf(
        player,
        "delete",
        cmd_player_delete,
        "delete a player: every token refused, its names erased",
    ).add_argument("user_id", type=user_id_arg)
    p = leaf(
        player,
        "deleted",
        cmd_player_deleted,
        "print the ids of the players deleted since TIME, one a line (read only; for a roll back)",
    )
    p.add_argument(
        "--since",
        required=True,
        metavar="TIME",
        help="a date or date and time (UTC unless given), or 30d, 12h, 90m",
    )
    leaf(
        player, "import", cmd_player_import, "insert or rename players from CSV or JSON lines"
    ).add_argument("file")

    leaf(
        top, "export", cmd_export, "write the whole store to a new file (JSON lines)"
    ).add_argument("file")
    leaf(
        top, "import", cmd_import, "load an export file into an empty store, all or nothing"
    ).add_argument("file")
    from authsvc.cli import backup_cmd

    backup_cmd.add_arguments(
        leaf(
            top,
            "backup",
            backup_cmd.cmd_backup,
            "copy the store to a new file (SQLite: a copy; PostgreSQL: pg_dump)",
        ),
        leaf(
            top,
            "restore",
            backup_cmd.cmd_restore,
            "replace the store by a backup, voiding every token and keeping deleted players "
            "deleted (services stopped)",
        ),
    )

    token = top.add_parser("token", help="game_auth_tokens").add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=_Parser
    )
    p = leaf(token, "issue", cmd_token_issue, "print a player's current token for a game")
    p.add_argument("--game", type=game_id_arg, required=True, metavar="GAME_ID")
    p.add_argument("--user", type=user_id_arg, required=True, metavar="USER_ID")

    audit_cmd.add_parsers(top, common, _Parser)
    api_token_cmd.add_parsers(top, common, _Parser)
    webhook_cmd.add_parsers(top, common, _Parser)
    secret_cmd.add_parsers(top, common, _Parser)
    setup_cmd.add_parsers(top, common, _Parser)

    from authsvc.cli import (
        check,
    )  # imported here: only `authsvc check` needs its HTTP and TLS modules

    p = leaf(
        top, "check", check.cmd_check, "call a running service at each URL and report each case"
    )
    check.add_arguments(p, user_id_arg, game_id_arg)

    from authsvc.cli import explain

    explain.add_arguments(
        leaf(
            top, "explain", explain.cmd_explain, "say why a request would fail, or that it succeeds"
        )
    )

    from authsvc.cli import heartbeat

    heartbeat.add_arguments(
        leaf(
            top,
            "heartbeat",
            heartbeat.cmd_heartbeat,
            "write the primary's time several times a second, for hot standbys to prove their "
            "freshness (runs until stopped)",
        )
    )
    from authsvc.webhooks import deliver

    leaf(
        top,
        "deliver",
        deliver.cmd_deliver,
        "send the events to their webhooks, signed, in order per player, retried (runs until "
        "stopped)",
    )
    return parser


def _line(error: Error) -> str:
    """An error as the command says it: its first line, bad input as the option at fault
    (``--old-key-ttl must be from 0 ...``: the body field ``/old_key_ttl`` of the admin API is the
    option ``--old-key-ttl`` here)."""
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    if error.field and error.field.startswith("/"):
        return f"--{error.field[1:].replace('_', '-')} {detail}"
    return detail


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env(require_secret=False)
        with audit_cmd.heads_logged():  # each committed write's new chain head, to the journal
            status, obj, text = args.func(args, settings)
    except (
        Error
    ) as e:  # the one mapping of errors to the command's line and exit code (authsvc/errors.py)
        message = _line(e)
        if args.json:
            print(json.dumps({"error": message}))
        print(f"authsvc: error: {message}", file=sys.stderr)
        return 1
    print(json.dumps(obj) if args.json else text)
    return status


if __name__ == "__main__":
    sys.exit(main())
