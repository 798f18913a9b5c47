"""The demo platform web tier (docs/integrating.md): sign up, sign in, change a password, and a page
that embeds one game in an iframe and hands it the player's token through
examples/clients/authsvc-platform.js (and a new one when the game asks: POST /token, after a
password change refused the old one).

Its own tiny SQLite store holds demo accounts (scrypt password hashes) and sessions. It talks to
authsvc's admin API only (docs/admin-api.md): PUT /v1/players/{id} at signup, POST
/v1/players/{id}/revoke at a password change, POST /v1/tokens when the page embeds the game (and at
the game's refresh). The
admin bearer token stays on this server; the page gets the player's token for this one game.

Every POST must come from this platform's own pages: its Origin header must be the platform's origin
(``--origin``), and every form carries a token tied to the browser's session cookie (an HMAC of it
under a key kept in the database), checked before anything runs; a password change needs the current
password. Stdlib only; run by ``python -m examples.platform --help``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import html
import http.cookies
import json
import secrets
import sqlite3
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIServer, make_server

CLIENT_JS = Path(__file__).resolve().parent.parent / "clients" / "authsvc-platform.js"
COOKIE = "demo_platform_session"
SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (user_id INTEGER PRIMARY KEY, username TEXT UNIQUE NOT NULL,
                                     salt BLOB NOT NULL, hash BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, user_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS keys (name TEXT PRIMARY KEY, value BLOB NOT NULL);
"""
FIRST_USER_ID = 1001


def password_hash(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1)


class AdminApi:
    """authsvc's admin API over HTTP, with the web tier's bearer token (scopes players:write,
    tokens:mint)."""

    def __init__(self, base_url: str, token: str):
        self.base_url, self.token = base_url.rstrip("/"), token

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Authorization": "Bearer " + self.token}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if method == "POST":
            headers["Idempotency-Key"] = str(
                uuid.uuid4()
            )  # a retry of this very call would be safe
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)


class Platform:
    def __init__(self, db_path: str, admin: AdminApi, game_id: int, game_url: str, origin: str):
        self.db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        self.db.executescript(SCHEMA)
        self.db.execute("INSERT OR IGNORE INTO keys VALUES ('csrf', ?)", (secrets.token_bytes(32),))
        (self.csrf_key,) = self.db.execute("SELECT value FROM keys WHERE name = 'csrf'").fetchone()
        self.admin, self.game_id, self.game_url, self.origin = admin, game_id, game_url, origin
        parts = urllib.parse.urlsplit(game_url)
        self.game_origin = f"{parts.scheme}://{parts.netloc}"
        self.lock = threading.Lock()  # one request at a time on the one SQLite connection: a demo

    def __call__(self, environ, start_response):
        with self.lock:
            return self.handle(environ, start_response)

    def handle(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        if path == "/authsvc-platform.js":
            return respond(
                start_response, "200 OK", CLIENT_JS.read_bytes(), "text/javascript; charset=utf-8"
            )
        user = self.session_user(environ)
        if method == "GET" and path == "/":
            return self.page(start_response, environ, user)
        if method == "POST" and environ.get("HTTP_ORIGIN") != self.origin:
            # Another site's page (another port of this host too: one site to the browser, which
            # sends the session cookie along) may post here; browsers send Origin with every POST,
            # and it cannot be forged.
            return respond(
                start_response,
                "403 Forbidden",
                b"Refused: a POST must come from this platform's own pages.\n",
                "text/plain; charset=utf-8",
            )
        if (
            method == "POST" and path == "/token"
        ):  # the page's refresh (authsvc-platform.js): a new token, as JSON
            # No form token here: this changes nothing a player sees, and only the platform's own
            # pages can read the answer (no CORS); the forms' token comes with it, as a password
            # change elsewhere made a new session.
            player, error = self.mint(user)
            if error:
                return respond(
                    start_response,
                    "503 Service Unavailable",
                    json.dumps({"error": error}).encode(),
                    "application/json",
                )
            sid = self.cookie_value(environ)
            answer = {"player": player, "csrf": self.csrf_token(sid) if sid else None}
            return respond(
                start_response, "200 OK", json.dumps(answer).encode(), "application/json"
            )
        if method == "POST" and path in ("/signup", "/signin", "/signout", "/password"):
            form = read_form(environ)
            sid = self.cookie_value(environ)
            if sid is None or not hmac.compare_digest(
                form.get("csrf", "").encode(), self.csrf_token(sid).encode()
            ):
                return self.page(
                    start_response,
                    environ,
                    user,
                    "This page was out of date (a sign-in or sign-out in another tab?): try again.",
                    "403 Forbidden",
                )
            error, cookie = getattr(self, path[1:])(form, user)
            if error:
                return self.page(start_response, environ, user, error)
            headers = [("Location", "/")] + ([("Set-Cookie", cookie)] if cookie else [])
            start_response("303 See Other", headers + [("Content-Length", "0")])
            return [b""]
        return respond(start_response, "404 Not Found", b"not found", "text/plain")

    @staticmethod
    def cookie_value(environ) -> str | None:
        """The session cookie: a signed-in player's session id, or the random id a signed-out
        browser got."""
        jar = http.cookies.SimpleCookie(environ.get("HTTP_COOKIE", ""))
        return jar[COOKIE].value if COOKIE in jar else None

    def csrf_token(self, sid: str) -> str:
        """The token each form carries: bound to the session cookie, so it changes with every
        sign-in and sign-out."""
        return hmac.new(self.csrf_key, b"csrf:" + sid.encode(), hashlib.sha256).hexdigest()

    def session_user(self, environ) -> tuple[int, str, str] | None:
        """(user id, username, session id) of the signed-in player, or None."""
        sid = self.cookie_value(environ)
        if sid is None:
            return None
        row = self.db.execute(
            "SELECT a.user_id, a.username, s.id FROM sessions s JOIN accounts a USING (user_id) "
            "WHERE s.id = ?",
            (sid,),
        ).fetchone()
        return (row[0], row[1], row[2]) if row else None

    def new_session(self, user_id: int | None) -> str:
        """A new session cookie: a signed-in one (a row), or for None a signed-out browser's (no
        row, a form token)."""
        sid = secrets.token_urlsafe(32)
        if user_id is not None:
            self.db.execute("INSERT INTO sessions VALUES (?, ?)", (sid, user_id))
        return f"{COOKIE}={sid}; Path=/; HttpOnly; SameSite=Lax"

    def signup(self, form, user):
        username, password = form.get("username", ""), form.get("password", "")
        if not (3 <= len(username) <= 20 and username.isalnum() and len(password) >= 8):
            return (
                "Pick a username of 3 to 20 letters or digits and a password of at least 8 "
                "characters.",
                None,
            )
        salt = secrets.token_bytes(16)
        try:
            self.db.execute("BEGIN IMMEDIATE")
            (top,) = self.db.execute(
                "SELECT COALESCE(MAX(user_id), ?) FROM accounts", (FIRST_USER_ID - 1,)
            ).fetchone()
            self.db.execute(
                "INSERT INTO accounts VALUES (?, ?, ?, ?)",
                (top + 1, username, salt, password_hash(password, salt)),
            )
            self.admin.call(
                "PUT", f"/v1/players/{top + 1}", {"username": username}
            )  # the player exists in authsvc
            self.db.execute("COMMIT")
        except sqlite3.IntegrityError:
            self.db.execute("ROLLBACK")
            return "That username is taken.", None
        except urllib.error.HTTPError as e:
            self.db.execute("ROLLBACK")
            if e.code == 422:  # authsvc's names rule (docs/admin.md) refused it
                return "That username is not allowed.", None
            return "Sign-up is unavailable right now; try again shortly.", None
        except (urllib.error.URLError, OSError):
            self.db.execute("ROLLBACK")
            return "Sign-up is unavailable right now; try again shortly.", None
        return None, self.new_session(top + 1)

    def signin(self, form, user):
        row = self.db.execute(
            "SELECT user_id, salt, hash FROM accounts WHERE username = ?",
            (form.get("username", ""),),
        ).fetchone()
        if row is None or not hmac.compare_digest(
            password_hash(form.get("password", ""), row[1]), row[2]
        ):
            return "Wrong username or password.", None
        return None, self.new_session(row[0])

    def signout(self, form, user):
        if user is not None:
            self.db.execute("DELETE FROM sessions WHERE id = ?", (user[2],))  # this browser only
        return None, f"{COOKIE}=; Path=/; Max-Age=0"

    def password(self, form, user):
        if user is None:
            return "Sign in first.", None
        salt, hashed = self.db.execute(
            "SELECT salt, hash FROM accounts WHERE user_id = ?", (user[0],)
        ).fetchone()
        if not hmac.compare_digest(password_hash(form.get("current_password", ""), salt), hashed):
            return "The current password is wrong.", None
        new = form.get("new_password", "")
        if len(new) < 8:
            return "Pick a new password of at least 8 characters.", None
        try:
            self.admin.call(
                "POST", f"/v1/players/{user[0]}/revoke"
            )  # every token of the player stops working
        except (urllib.error.URLError, OSError):
            return "Password change is unavailable right now; try again shortly.", None
        salt = secrets.token_bytes(16)
        self.db.execute(
            "UPDATE accounts SET salt = ?, hash = ? WHERE user_id = ?",
            (salt, password_hash(new, salt), user[0]),
        )
        self.db.execute(
            "DELETE FROM sessions WHERE user_id = ?", (user[0],)
        )  # sign out everywhere, then in here
        return None, self.new_session(user[0])

    def mint(self, user) -> tuple[dict | None, str | None]:
        """(the player the game gets: its token for this game, minted now; or None for a guest), or
        an error."""
        if user is None:
            return None, None
        try:
            minted = self.admin.call(
                "POST", "/v1/tokens", {"game_id": self.game_id, "user_id": user[0]}
            )
        except (urllib.error.URLError, OSError):
            return None, "The game cannot be started right now; try again shortly."
        return {
            "user_id": user[0],
            "username": user[1],
            "game_auth_token": minted["game_auth_token"],
        }, None

    def page(self, start_response, environ, user, error: str | None = None, status: str = "200 OK"):
        headers = [("Content-Security-Policy", "frame-ancestors 'none'")]
        sid = self.cookie_value(environ)
        if (
            sid is None
        ):  # a browser's first visit (or after a sign-out): a cookie for its forms' token
            cookie = self.new_session(None)
            headers.append(("Set-Cookie", cookie))
            sid = cookie.partition("=")[2].partition(";")[0]
        player, mint_error = self.mint(user)
        body = render(
            user, player, error or mint_error, self.game_url, self.game_origin, self.csrf_token(sid)
        )
        return respond(start_response, status, body.encode(), "text/html; charset=utf-8", headers)


def render(user, player, error, game_url, game_origin, csrf: str) -> str:
    e = html.escape
    token = f'<input type="hidden" name="csrf" value="{e(csrf)}">'
    if user is None:
        account = f"""<h2>Sign up</h2><form method="post" action="/signup" id="signup">{token}
<input name="username" placeholder="username">
<input name="password" type="password" placeholder="password">
<button>Sign up</button></form>
<h2>Sign in</h2><form method="post" action="/signin" id="signin">{token}
<input name="username" placeholder="username">
<input name="password" type="password" placeholder="password">
<button>Sign in</button></form>"""
    else:
        account = f"""<p id="me">Signed in as <b>{e(user[1])}</b> (user {user[0]})</p>
<form method="post" action="/signout" id="signout">{token}<button>Sign out</button></form>
<form method="post" action="/password" id="password">{token}
<input name="current_password" type="password" placeholder="current password">
<input name="new_password" type="password" placeholder="new password">
 <button>Change password</button></form>"""
    # The page's script: what this player's game gets, nothing more (json.dumps, then no "</" can
    # end the script).
    config = json.dumps({"gameOrigin": game_origin, "player": player}).replace("</", "<\\/")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Demo platform</title>
<style>body{{font-family:sans-serif;margin:1em 2em}}
iframe{{width:640px;height:300px;border:2px solid #468}}
.error{{color:#b00}}</style><script src="/authsvc-platform.js"></script></head><body>
<h1>Demo platform</h1>{f'<p class="error" id="error">{e(error)}</p>' if error else ""}{account}
<h2>Play</h2><iframe id="game" src="{e(game_url)}" title="game"></iframe>
<script>
var config = {config};
// The game's refresh (its token was refused: a new password): this server mints a new token for the
// player signed in now. If another player signed in or out in another tab, the whole page follows.
config.refresh = function () {{
  return fetch("/token", {{method: "POST"}}).then(function (r) {{
    if (!r.ok) throw new Error("no new token");
    return r.json();
  }}).then(function (answer) {{
    document.querySelectorAll("input[name=csrf]").forEach(function (input) {{
      input.value = answer.csrf;
    }});
    var now = answer.player && answer.player.user_id;
    var before = config.player && config.player.user_id;
    if (now !== before) {{ location.reload(); return new Promise(function () {{}}); }}
    return answer.player;
  }});
}};
AuthsvcPlatform.host(document.getElementById("game"), config);
</script></body></html>"""


def read_form(environ) -> dict[str, str]:
    try:
        length = min(int(environ.get("CONTENT_LENGTH") or 0), 16384)
    except ValueError:
        length = 0
    return dict(
        urllib.parse.parse_qsl(environ["wsgi.input"].read(length).decode("utf-8", "replace"))
    )


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
        prog="python -m examples.platform", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--origin",
        help="the origin the platform's pages are served from, exactly "
        "(default http://127.0.0.1:PORT); a POST from any other is refused",
    )
    parser.add_argument("--db", default="var/demo-platform.db")
    parser.add_argument("--admin-url", default="http://127.0.0.1:8081", help="authsvc's admin API")
    parser.add_argument(
        "--admin-token-file", required=True, help="file holding the admin API bearer token"
    )
    parser.add_argument("--game-id", type=int, required=True)
    parser.add_argument(
        "--game-url", default="http://127.0.0.1:8200/play", help="the game page the iframe shows"
    )
    args = parser.parse_args(argv)
    token = Path(args.admin_token_file).read_text().strip()
    origin = args.origin or f"http://127.0.0.1:{args.port}"
    app = Platform(
        args.db, AdminApi(args.admin_url, token), args.game_id, args.game_url, origin.rstrip("/")
    )
    with make_server("127.0.0.1", args.port, app, server_class=ThreadingServer) as server:
        print(f"demo platform on http://127.0.0.1:{args.port}/", flush=True)
        server.serve_forever()
