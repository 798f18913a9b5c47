"""``authsvc check``: call a running service the way a game server does, and report.

What a sysadmin runs after installing, against both hosts::

    sudo authsvc check --game-id 1 --user-id 42 --api-key-file key.txt \\
        --base-url https://api.example.com --base-url http://legacy.example.com

For each base URL four cases are checked: success (the player's id and username
come back), a bad token and a bad api key (error 403), a missing parameter
(error 400). The token is minted from the token secret and the player's current
credential epoch in the store (``--token-file`` gives one instead). Any mismatch,
a redirect or an unreachable URL makes the exit status 1; so does a SQLite store's
disk with too little free space for an admin write (one more, failed, check).

The api key and token are read from files (``-`` is stdin), never from the
command line, and never printed. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import socket
import ssl
import sys
import urllib.parse

from authsvc import release
from authsvc.cli.explain import RefusedSecret
from authsvc.errors import CommandError, Error, InvalidCredentials, MissingCredentials
from authsvc.settings import Settings
from authsvc.store import open_store, redact_url
from authsvc.tokens import check_known, current_token
from authsvc.web.answers import body_of
from authsvc.web.app import AUTHENTICATE_PATH as API_PATH
from authsvc.web.http import json_bytes

MAX_ANSWER_BYTES = 64 * 1024


class CheckError(CommandError):
    """The check cannot start (bad URL, unreadable file, unknown player): exit 1."""


@dataclasses.dataclass
class Result:
    base_url: str
    case: str
    ok: bool
    status: int | None
    detail: str

    def line(self) -> str:
        status = f"HTTP {self.status}" if self.status is not None else "no answer"
        return (
            f"{'ok  ' if self.ok else 'FAIL'}  {self.base_url}  {self.case:<17} {status}: "
            f"{self.detail}"
        )


@dataclasses.dataclass
class Target:
    """Where one base URL points: scheme, host (for SNI and Host), port, path prefix, address to
    dial."""

    base_url: str
    scheme: str
    host: str
    port: int
    prefix: str
    address: str

    @classmethod
    def parse(cls, base_url: str, resolve: dict[tuple[str, int], str]) -> Target:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CheckError(
                f"--base-url must be http://HOST[:PORT] or https://HOST[:PORT], got {base_url!r}"
            )
        if parts.query or parts.fragment or parts.username:
            raise CheckError(f"--base-url takes no query, fragment or user: {base_url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = resolve.get((parts.hostname.lower(), port), parts.hostname)
        return cls(
            base_url.rstrip("/"),
            parts.scheme,
            parts.hostname,
            port,
            parts.path.rstrip("/"),
            address,
        )


def _read_secret_file(path: str, what: str) -> str:
    try:
        if path == "-":
            text = sys.stdin.readline()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.readline()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckError(
            f"cannot read the {what} file {path}: {getattr(e, 'strerror', None) or 'not UTF-8'}"
        ) from None
    value = text.strip()
    if not value:
        raise CheckError(f"the {what} file {path} is empty")
    return value


def _parse_resolve(items: list[str]) -> dict[tuple[str, int], str]:
    table = {}
    for item in items:
        host, sep1, rest = item.partition(":")
        port, sep2, address = rest.partition(":")
        if not (sep1 and sep2 and host and port.isdigit() and address):
            raise CheckError(f"--resolve takes HOST:PORT:ADDRESS, got {item!r}")
        table[(host.lower(), int(port))] = address.strip("[]")
    return table


def fetch(target: Target, query: dict[str, str], context: ssl.SSLContext, timeout: float):
    """One GET; returns (HTTP status, parsed JSON object or None, problem text or None)."""
    path = target.prefix + API_PATH + "?" + urllib.parse.urlencode(query)
    sock = socket.create_connection((target.address, target.port), timeout=timeout)
    try:
        if target.scheme == "https":
            sock = context.wrap_socket(sock, server_hostname=target.host)
        conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
        conn.sock = sock
        default_port = 443 if target.scheme == "https" else 80
        host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
        conn.request("GET", path, headers={"Host": host_header, "User-Agent": "authsvc-check"})
        response = conn.getresponse()
        body = response.read(MAX_ANSWER_BYTES)
        status, content_type = response.status, response.getheader("Content-Type", "")
        location = response.getheader("Location")
    finally:
        sock.close()
    if 300 <= status < 400:
        return (
            status,
            None,
            f"redirected{' elsewhere' if location else ''}: game servers do not follow redirects",
        )
    if not content_type.startswith("application/json"):
        return status, None, f"Content-Type is {content_type or 'missing'}, not application/json"
    try:
        obj = json.loads(body)
    except ValueError:
        return status, None, "the body is not JSON"
    if not isinstance(obj, dict):
        return status, None, "the body is not a JSON object"
    return status, obj, None


def _expect_error(error: type[Error]):
    """The game door's answer to ``error`` (its one table, authsvc/web/answers.py), with HTTP 200 or
    its status."""
    expected = body_of(error)
    want, code = json.loads(expected), error.status

    def judge(status: int, obj: dict) -> str | None:
        if obj != want:
            return f"expected {expected.decode()}, got {json_bytes(obj).decode()}"
        if status not in (200, code):
            return f"expected HTTP 200 or {code}"
        return None

    return judge


def _expect_success(user_id: int, username: str | None):
    def judge(status: int, obj: dict) -> str | None:
        if status != 200 or obj.get("success") is not True or obj.get("user_id") != user_id:
            return f"expected success for user {user_id}, got {json_bytes(obj).decode()}"
        if set(obj) != {"success", "user_id", "username"}:
            return f"unexpected fields {sorted(obj)}"
        if username is not None and obj.get("username") != username:
            return f"expected username {username!r}, got {obj.get('username')!r}"
        return None

    return judge


def _bad_token(token: str) -> str:
    """The token with its last character changed: same shape, wrong value."""
    return token[:-1] + ("0" if token[-1:] != "0" else "1")


def _bad_key(api_key: str) -> str:
    return api_key[:-1] + ("0" if api_key[-1:] != "0" else "1")


def run_checks(
    targets: list[Target],
    user_id: int,
    api_key: str,
    token: str,
    username: str | None,
    context: ssl.SSLContext,
    timeout: float,
) -> list[Result]:
    good = {"user_id": str(user_id), "game_auth_token": token, "api_key": api_key}
    cases = [
        ("success", good, _expect_success(user_id, username)),
        (
            "bad token",
            {**good, "game_auth_token": _bad_token(token)},
            _expect_error(InvalidCredentials),
        ),
        ("bad api key", {**good, "api_key": _bad_key(api_key)}, _expect_error(InvalidCredentials)),
        (
            "missing parameter",
            {"user_id": str(user_id), "api_key": api_key},
            _expect_error(MissingCredentials),
        ),
    ]
    results = []
    for target in targets:
        for name, query, judge in cases:
            try:
                status, obj, problem = fetch(target, query, context, timeout)
            except ssl.SSLError as e:
                results.append(
                    Result(
                        target.base_url,
                        name,
                        False,
                        None,
                        f"TLS failed: {e.reason or type(e).__name__}",
                    )
                )
                continue
            except (OSError, http.client.HTTPException) as e:
                reason = getattr(e, "strerror", None) or type(e).__name__
                results.append(
                    Result(target.base_url, name, False, None, f"cannot connect or read: {reason}")
                )
                continue
            if problem is None:
                problem = judge(status, obj)
            results.append(
                Result(target.base_url, name, problem is None, status, problem or "as expected")
            )
    return results


def ssl_context(cafile: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def player_token(settings: Settings, game_id: int, user_id: int) -> tuple[str, str]:
    """(token, username) from the store and the current token secret, as `authsvc token issue` mints
    it."""
    if not settings.token_secrets:
        raise CheckError(f"no token secret at {settings.token_secret_file} (or give --token-file)")
    store = open_store(settings.store, readonly=True, settings=settings)
    try:
        store.check()  # a missing or unmigrated store: ConfigError, one line (run 'authsvc init')
        # A secret the store was never used with would mint a token only a service as wrong accepts:
        # refused.
        check_known(settings.token_secrets, store.token_secrets(), settings.token_secret_file)
        token, player = current_token(store, settings.token_secrets[0], game_id, user_id)
    finally:
        store.close()
    return token, player.username


def store_disk_full(settings: Settings) -> str | None:
    """Why the store's disk cannot take an admin write (SQLite: its free space), or None
    (PostgreSQL: not visible from here)."""
    store = open_store(settings.store, readonly=True, settings=settings)
    try:
        return store.disk_full()
    finally:
        store.close()


def cmd_check(args: argparse.Namespace, settings: Settings) -> tuple[int, dict, str]:
    """The `authsvc check` subcommand: (exit status, report object, report text); status 1 on any
    mismatch."""
    try:
        resolve = _parse_resolve(args.resolve)
        targets = [Target.parse(url, resolve) for url in args.base_url]
        api_key = _read_secret_file(args.api_key_file, "api key")
        full = None
        if args.token_file:
            token, username = _read_secret_file(args.token_file, "token"), args.username
        else:
            token, username = player_token(settings, args.game_id, args.user_id)
            username = args.username or username
            full = store_disk_full(settings)
        context = ssl_context(args.cafile)
    except (OSError, ssl.SSLError) as e:  # the stdlib's failures in the model's words
        raise CommandError(str(e)) from None
    results = run_checks(targets, args.user_id, api_key, token, username, context, args.timeout)
    if (
        full is not None
    ):  # a check of its own only when it fails: the service answers, the admin side cannot write
        results.append(Result(redact_url(settings.store), "store disk", False, None, full))
    failed = [r for r in results if not r.ok]
    # The release of the command that checked (CHANGELOG.md): what a sysadmin pastes into a ticket
    # says it.
    obj = {
        "ok": not failed,
        "version": release(),
        "results": [dataclasses.asdict(r) for r in results],
    }
    text = (
        "\n".join(r.line() for r in results)
        + (
            f"\n{len(failed)} of {len(results)} checks FAILED"
            if failed
            else f"\nall {len(results)} checks passed"
        )
        + f" (authsvc {release()})"
    )
    return (1 if failed else 0), obj, text


def add_arguments(p: argparse.ArgumentParser, user_id_type, game_id_type) -> None:
    p.add_argument(
        "--base-url",
        action="append",
        required=True,
        metavar="URL",
        help="service address, e.g. https://api.example.com (repeat for the legacy host)",
    )
    p.add_argument("--game-id", type=game_id_type, required=True, help="a game of the store")
    p.add_argument("--user-id", type=user_id_type, required=True, help="a player of the store")
    p.add_argument(
        "--api-key-file",
        required=True,
        metavar="FILE",
        help="file holding the game's api key ('-': stdin)",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the player's game_auth_token; default: mint it from the token secret "
        "and the store",
    )
    # Not abbreviations of the -file options: a secret given here would be quoted as a file name.
    p.add_argument("--token", "--api-key", action=RefusedSecret, help=argparse.SUPPRESS)
    p.add_argument("--username", help="expected username (default: the store's)")
    p.add_argument(
        "--cafile",
        metavar="PEM",
        help="CA certificates to verify HTTPS with (default: the system's)",
    )
    p.add_argument(
        "--resolve",
        action="append",
        default=[],
        metavar="HOST:PORT:ADDRESS",
        help="connect to ADDRESS for HOST:PORT (like curl --resolve), e.g. before DNS points at "
        "the machine",
    )
    p.add_argument(
        "--timeout", type=float, default=5.0, metavar="SECONDS", help="per request (default 5)"
    )
