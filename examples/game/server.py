"""A reference game server (docs/integrating.md): the few lines a game copies to log platform
players in.

The game's page runs inside the platform's iframe and gets {user_id, username, game_auth_token}
(or "guest") from examples/clients/authsvc-platform.js; it sends user_id and the token to this
server, which asks authsvc (GET /api/authenticate.json, docs/api.md) with the game's api key, kept
here and never sent to a browser. Then, on the game's own SQLite users:

- the first visit creates an account holding the platform user id and username;
- later visits look it up by platform user id;
- a player who had a game account of the game's own (name and password) may link it instead: a
  password guess each time, so a few attempts per player and per account in a window (then 429 with
  Retry-After), and the slow password hash runs outside the server's one lock;
- authsvc's 403 (the player changed their password since the page loaded) asks for a reload, and
  the Reload button asks the platform page for a fresh token (authsvc-platform.js's refresh);
- a 503 or no answer is "try again shortly", never a logout;
- the platform's events (POST /webhooks/authsvc, signed: verify_webhook): a deleted player's account
  is erased (a linked game account loses only the link), a renamed one takes the new name.

Stdlib only; ``python -m examples.game --help``.
"""

from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import hmac
import html
import json
import math
import secrets
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIServer, make_server

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, salt BLOB, hash BLOB,
    platform_user_id INTEGER UNIQUE, coins INTEGER NOT NULL DEFAULT 0);
"""


def password_hash(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1)


class Attempts:
    """At most ``limits[kind]`` attempts per key of that kind in any ``window`` seconds (a sliding
    window).

    ``take(keys)`` counts one attempt against every key at once, or none if any of them is at its
    limit; it answers 0, or the seconds until the fullest key frees a place. Memory is bounded: at
    most ``max_keys`` keys are kept; when that many hold attempts still in their window, a new key
    is refused (for a window) rather than an old one forgotten, which would let a guesser start
    afresh.
    """

    def __init__(
        self, limits: dict[str, int], window: float, max_keys: int = 100_000, clock=time.monotonic
    ):
        self.limits, self.window, self.max_keys, self.clock = limits, window, max_keys, clock
        self.seen: dict[tuple, collections.deque] = {}
        self.lock = threading.Lock()

    def take(self, keys: list[tuple[str, object]]) -> float:
        with self.lock:
            now = self.clock()
            wait = 0.0
            for key in keys:
                times = self.seen.get(key)
                while times and times[0] <= now - self.window:
                    times.popleft()
                if times is not None and len(times) >= self.limits[key[0]]:
                    wait = max(wait, times[0] + self.window - now)
            if wait:
                return wait
            new = [key for key in keys if key not in self.seen]
            if new and len(self.seen) + len(new) > self.max_keys:
                self.seen = {k: t for k, t in self.seen.items() if t and t[-1] > now - self.window}
                if len(self.seen) + len(new) > self.max_keys:
                    return self.window
            for key in keys:
                self.seen.setdefault(key, collections.deque()).append(now)
            return 0.0


def authenticate(authsvc_url: str, api_key: str, user_id, token) -> tuple[str, str | None]:
    """("ok", username), ("reload", None) for a 403 or 400, or ("unavailable", None) for a 503, a
    500 or no answer."""
    query = urllib.parse.urlencode(
        {"user_id": user_id, "game_auth_token": token, "api_key": api_key}
    )
    try:
        with urllib.request.urlopen(
            f"{authsvc_url.rstrip('/')}/api/authenticate.json?{query}", timeout=5
        ) as response:
            answer = json.load(response)
    except (
        urllib.error.URLError,
        OSError,
        ValueError,
    ):  # an HTTP 503/500, refused, timed out, not JSON
        return "unavailable", None
    if answer.get("success") is True:
        return "ok", answer["username"]
    if answer.get("error") in (
        400,
        403,
    ):  # wrong or stale credentials: a new token is needed, so reload
        return "reload", None
    return "unavailable", None  # a 503 answered with HTTP 200 (docs/api.md, "Answers")


def verify_webhook(secret: str, headers, body: bytes, tolerance: int = 300) -> dict | None:
    """The event a webhook POST carries if its Standard Webhooks signature is good and recent, else
    None.

    ``secret``: the ``whsec_...`` the subscription gave; ``headers``: the request's, by lower-case
    name. Other languages: the Standard Webhooks libraries (standardwebhooks on PyPI and npm, and
    for Go, Ruby, PHP, Java, C#, Rust, Kotlin, Elixir) do the same check.
    """
    msg_id, timestamp = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "")
    if not msg_id or not timestamp.isdigit() or abs(time.time() - int(timestamp)) > tolerance:
        return None  # an old message replayed, or a clock far off
    key = base64.b64decode(secret.removeprefix("whsec_") + "==")
    expected = base64.b64encode(
        hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    )
    for signature in headers.get("webhook-signature", "").split():
        version, _, value = signature.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return json.loads(body)
    return None


class Game:
    def __init__(
        self,
        db_path: str,
        authsvc_url: str,
        api_key: str,
        platform_url: str,
        link_attempts: Attempts | None = None,
        webhook_secret: str | None = None,
    ):
        self.db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        self.db.executescript(SCHEMA)
        self.authsvc_url, self.api_key, self.platform_url = (
            authsvc_url,
            api_key,
            platform_url.rstrip("/"),
        )
        parts = urllib.parse.urlsplit(platform_url)
        self.platform_origin = f"{parts.scheme}://{parts.netloc}"
        self.lock = threading.Lock()  # one request at a time on the one SQLite connection: a demo
        # Link attempts: 5 per platform player and 10 per game account in 5 minutes, unless told
        # otherwise.
        self.link_attempts = link_attempts or Attempts({"player": 5, "account": 10}, window=300)
        self.hashing = threading.BoundedSemaphore(
            4
        )  # password hashes at once (16 MiB of memory each)
        # A name no account holds is checked against this, as long as a real one: the time tells
        # nothing.
        salt = secrets.token_bytes(16)
        self.no_account = (salt, password_hash(secrets.token_hex(16), salt))
        self.webhook_secret = webhook_secret

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        if method == "GET" and path == "/play":
            body = (
                PAGE.replace("{platform_origin}", json.dumps(self.platform_origin))
                .replace("{platform_url}", html.escape(self.platform_url + "/"))
                .replace(
                    "{platform_script}", html.escape(self.platform_origin + "/authsvc-platform.js")
                )
            )
            # Only the platform may frame the game (a click-jacking page may not).
            return respond(
                start_response,
                "200 OK",
                body.encode(),
                "text/html; charset=utf-8",
                [("Content-Security-Policy", f"frame-ancestors {self.platform_origin}")],
            )
        if method == "POST" and path in ("/api/login", "/api/play", "/api/link"):
            try:
                length = min(int(environ.get("CONTENT_LENGTH") or 0), 16384)
                request = json.loads(environ["wsgi.input"].read(length) or b"{}")
                user_id, token = int(request["user_id"]), str(request["game_auth_token"])
            except (ValueError, KeyError, TypeError):
                return self.json(start_response, {"status": "bad-request"})
            status, username = authenticate(self.authsvc_url, self.api_key, user_id, token)
            if status != "ok":
                return self.json(start_response, {"status": status})
            if path == "/api/link":  # takes the lock itself, not while it hashes
                return self.link(start_response, user_id, request)
            with self.lock:
                answer = getattr(self, path.rpartition("/")[2])(user_id, username, request)
            return self.json(start_response, answer)
        if method == "POST" and path == "/webhooks/authsvc" and self.webhook_secret:
            body = environ["wsgi.input"].read(min(int(environ.get("CONTENT_LENGTH") or 0), 65536))
            headers = {
                k[5:].replace("_", "-").lower(): v
                for k, v in environ.items()
                if k.startswith("HTTP_")
            }
            event = verify_webhook(self.webhook_secret, headers, body)
            if event is None:
                return respond(start_response, "401 Unauthorized", b"bad signature", "text/plain")
            with self.lock:
                self.on_event(event["type"], event["data"])
            return respond(start_response, "204 No Content", b"", "text/plain")
        return respond(start_response, "404 Not Found", b"not found", "text/plain")

    def on_event(self, type: str, data: dict) -> None:
        """An event may come twice (the same webhook-id): each change here gives the same result
        again."""
        user_id = data.get("user_id")
        if type == "player.deleted":  # the platform erased the player: so does the game
            self.db.execute(
                "DELETE FROM accounts WHERE platform_user_id = ? AND hash IS NULL", (user_id,)
            )
            self.db.execute(
                "UPDATE accounts SET platform_user_id = NULL WHERE platform_user_id = ?", (user_id,)
            )
        elif type == "player.renamed":  # an account the platform made takes the new name, if free
            name = data["username"]
            if self.db.execute(
                "SELECT 1 FROM accounts WHERE name = ? AND platform_user_id IS NOT ?",
                (name, user_id),
            ).fetchone():
                name = f"{name}_{user_id}"
            try:
                self.db.execute(
                    "UPDATE accounts SET name = ? WHERE platform_user_id = ? AND hash IS NULL",
                    (name, user_id),
                )
            except sqlite3.IntegrityError:
                pass  # that name is taken too: the account keeps its name

    def account_locked(self, user_id: int) -> dict | None:
        with self.lock:
            return self.account(user_id)

    def account(self, user_id: int) -> dict | None:
        row = self.db.execute(
            "SELECT name, coins FROM accounts WHERE platform_user_id = ?", (user_id,)
        ).fetchone()
        return {"name": row[0], "coins": row[1]} if row else None

    def login(self, user_id: int, username: str, request: dict) -> dict:
        account = self.account(user_id)
        if account is not None:
            return {"status": "welcome", "account": account}
        name = username  # the platform's name, unless one of the game's own accounts holds it
        if self.db.execute("SELECT 1 FROM accounts WHERE name = ?", (name,)).fetchone():
            name = f"{username}_{user_id}"
        self.db.execute(
            "INSERT INTO accounts (name, platform_user_id) VALUES (?, ?)", (name, user_id)
        )
        return {"status": "new", "account": self.account(user_id)}

    def play(self, user_id: int, username: str, request: dict) -> dict:
        self.db.execute(
            "UPDATE accounts SET coins = coins + 1 WHERE platform_user_id = ?", (user_id,)
        )
        return {"status": "played", "account": self.account(user_id)}

    def link(self, start_response, user_id: int, request: dict):
        """A player proves a game account of the game's own with its name and password: a password
        guess each time, so limited per player and per account (429 with Retry-After), and hashed
        outside the lock."""
        name, password = str(request.get("name", "")), str(request.get("password", ""))
        account_key = hashlib.sha256(
            name.encode("utf-8", "replace")
        ).digest()  # bounded memory, whatever the name
        wait = self.link_attempts.take([("player", user_id), ("account", account_key)])
        if wait:
            retry_after = str(max(1, math.ceil(wait)))
            return respond(
                start_response,
                "429 Too Many Requests",
                json.dumps(
                    {"status": "too-many-attempts", "retry_after": int(retry_after)}
                ).encode(),
                "application/json",
                [("Retry-After", retry_after)],
            )
        try:
            name.encode(), password.encode()
        except (
            UnicodeEncodeError
        ):  # JSON may hold a lone surrogate; no account's name or password does
            return self.json(
                start_response, {"status": "link-refused", "account": self.account_locked(user_id)}
            )
        with self.lock:
            row = self.db.execute(
                "SELECT id, salt, hash, platform_user_id FROM accounts WHERE name = ? AND hash IS "
                "NOT NULL",
                (name,),
            ).fetchone()
        salt, expected = (row[1], row[2]) if row else self.no_account
        with self.hashing:
            matches = hmac.compare_digest(password_hash(password, salt), expected)
        with self.lock:
            if row is None or not matches or row[3] not in (None, user_id):
                return self.json(
                    start_response, {"status": "link-refused", "account": self.account(user_id)}
                )
            self.db.execute("BEGIN IMMEDIATE")
            # The account made for this player on the first visit (no password of its own) gives
            # way.
            self.db.execute(
                "DELETE FROM accounts WHERE platform_user_id = ? AND hash IS NULL", (user_id,)
            )
            # Only the account checked, with the password checked, still free: it may have changed
            # while hashing.
            linked = self.db.execute(
                "UPDATE accounts SET platform_user_id = ? WHERE id = ? AND hash = ? AND "
                "(platform_user_id IS NULL OR platform_user_id = ?)",
                (user_id, row[0], row[2], user_id),
            ).rowcount
            self.db.execute("COMMIT" if linked else "ROLLBACK")
            answer = {
                "status": "linked" if linked else "link-refused",
                "account": self.account(user_id),
            }
        return self.json(start_response, answer)

    def json(self, start_response, answer: dict):
        return respond(start_response, "200 OK", json.dumps(answer).encode(), "application/json")


def add_account(db_path: str, name: str, password: str) -> None:
    """One of the game's own accounts (from before the platform): a name and a password."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.executescript(SCHEMA)
    salt = secrets.token_bytes(16)
    db.execute(
        "INSERT INTO accounts (name, salt, hash) VALUES (?, ?, ?)",
        (name, salt, password_hash(password, salt)),
    )
    db.close()


def respond(start_response, status, body: bytes, content_type, extra=()):
    start_response(
        status,
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            *extra,
        ],
    )
    return [body]


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.game", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--db", default="var/demo-game.db")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the game")
    serve.add_argument("--port", type=int, default=8200)
    serve.add_argument(
        "--authsvc-url", default="http://127.0.0.1:8000", help="authsvc's game-facing service"
    )
    serve.add_argument(
        "--api-key-file", required=True, help="file holding the game's api key (authsvc game add)"
    )
    serve.add_argument(
        "--platform-url", default="http://127.0.0.1:8100/", help="the platform that embeds the game"
    )
    serve.add_argument(
        "--link-attempts-per-player",
        type=int,
        default=5,
        metavar="N",
        help="link attempts (password guesses) a platform player may make in a window (default 5)",
    )
    serve.add_argument(
        "--link-attempts-per-account",
        type=int,
        default=10,
        metavar="N",
        help="link attempts on one game account in a window, by all players (default 10)",
    )
    serve.add_argument(
        "--link-window", type=float, default=300, metavar="SECONDS", help="the window (default 300)"
    )
    serve.add_argument(
        "--webhook-secret-file",
        help="file holding the webhook's whsec_ secret: serve /webhooks/authsvc",
    )
    add = sub.add_parser(
        "add-account", help="add one of the game's own accounts (the password is read from stdin)"
    )
    add.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "add-account":
        add_account(args.db, args.name, sys.stdin.readline().strip())
        return
    api_key = Path(args.api_key_file).read_text().strip()
    attempts = Attempts(
        {"player": args.link_attempts_per_player, "account": args.link_attempts_per_account},
        window=args.link_window,
    )
    secret = (
        Path(args.webhook_secret_file).read_text().strip() if args.webhook_secret_file else None
    )
    app = Game(args.db, args.authsvc_url, api_key, args.platform_url, attempts, secret)
    with make_server("127.0.0.1", args.port, app, server_class=ThreadingServer) as server:
        print(f"demo game on http://127.0.0.1:{args.port}/play", flush=True)
        server.serve_forever()


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Demo game</title>
<style>body{font-family:sans-serif;background:#eef4ea;margin:.6em}
.notice{color:#a40;font-weight:bold}
#guest,#link,#reload{display:none}</style></head><body>
<h3>Coin Collector (demo game)</h3>
<p id="status">Connecting to the platform ...</p>
<div id="guest"><p>An account is required to play.</p>
  <a id="signin" href="{platform_url}" target="_top"><button>Sign in or register</button></a></div>
<div id="playing" style="display:none"><p>Playing as <b id="who"></b></p>
  <button id="play">Collect a coin</button> coins: <span id="coins">0</span></div>
<form id="link"><p>Played here before the platform? Link your game account:
  <input id="link-name" placeholder="game username">
  <input id="link-password" type="password" placeholder="game password">
  <button>Link</button></p></form>
<p id="reload"><button>Reload</button></p>
<script src="{platform_script}"></script>
<script>
"use strict";
var platformOrigin = {platform_origin}, player = null;
function show(id, on) { document.getElementById(id).style.display = on ? "block" : "none"; }
function say(text, notice) {
  var s = document.getElementById("status");
  s.textContent = text;
  s.className = notice ? "notice" : "";
}
function call(path, extra) {
  var body = Object.assign({user_id: player.user_id, game_auth_token: player.game_auth_token},
                           extra || {});
  return fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                      body: JSON.stringify(body)})
    .then(function (r) { return r.json(); })
    .catch(function () { return {status: "unavailable"}; })
    .then(handle);
}
function handle(a) {
  if (a.account) {
    document.getElementById("who").textContent = a.account.name;
    document.getElementById("coins").textContent = a.account.coins;
    show("playing", true);
  }
  if (a.status === "new") { say("New account created: " + a.account.name); show("link", true); }
  else if (a.status === "welcome") say("Welcome back, " + a.account.name + " (logged in)");
  else if (a.status === "linked") {
    say("Linked: you play as " + a.account.name);
    show("link", false);
  }
  else if (a.status === "link-refused") say("That game username and password do not match.", true);
  else if (a.status === "too-many-attempts")
    say("Too many tries: try again in " + a.retry_after + " s.", true);
  else if (a.status === "played") say("A coin!");
  else if (a.status === "reload") {
    say("Your platform sign-in has changed (a new password?). Please reload the page.", true);
    show("playing", false); show("link", false); show("reload", true);
  } else if (a.status === "unavailable") say("The login service is busy: try again shortly.", true);
  else say("Something went wrong: reload the page.", true);
}
function guest() {
  say("You are not signed in to the platform.");
  show("guest", true); show("playing", false); show("link", false);
}
document.getElementById("play").onclick = function () { call("/api/play"); };
// Reload: the platform page mints a fresh token and pushes it (reloading this frame alone would
// get the token the platform page holds, the one just refused, again).
document.querySelector("#reload button").onclick = function () {
  say("Signing in again ...");
  show("reload", false);
  AuthsvcPlatform.refresh({platformOrigin: platformOrigin}).then(function (p) {
    player = p;
    if (!p) guest(); else call("/api/login");
  }, function () {
    say("The platform did not answer: reload the page.", true);
    show("reload", true);
  });
};
document.getElementById("link").onsubmit = function (e) {
  e.preventDefault();
  call("/api/link", {name: document.getElementById("link-name").value,
                     password: document.getElementById("link-password").value});
};
AuthsvcPlatform.connect({platformOrigin: platformOrigin}).then(function (p) {
  player = p;
  if (!p) guest(); else call("/api/login");
}, function () { say("The platform did not answer: reload the page.", true); });
</script></body></html>
"""
