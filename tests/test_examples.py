"""The demo platform and the reference game (examples/, docs/integrating.md) on real processes, without a
browser: what a copy of them must keep. The browser's view of the same is tests/test_integration_browser.py.

The platform refuses a POST from any other origin and a form without the token tied to the session
cookie, each on its own; a password change needs the current password.
"""

from __future__ import annotations

import http.client
import re
import sqlite3
import urllib.parse

import pytest

from tests.demo_support import demo_loop

pytestmark = pytest.mark.slow
COOKIE = "demo_platform_session"


@pytest.fixture
def loop(tmp_path, secret_file):
    with demo_loop(tmp_path, secret_file) as servers:
        yield servers


class Client:
    """A browser's requests to the platform, by hand: its one cookie, and the Origin header it sends."""

    def __init__(self, port: int, origin: str):
        self.port, self.origin, self.cookie = port, origin, None

    def request(self, method: str, path: str, form: dict | None = None, origin: str | None = None) -> tuple[int, str]:
        headers = {"Cookie": f"{COOKIE}={self.cookie}"} if self.cookie else {}
        if method == "POST" and (origin or self.origin) != "-":  # "-": no Origin header at all
            headers["Origin"] = origin or self.origin
        body = None
        if form is not None:
            body, headers["Content-Type"] = urllib.parse.urlencode(form), "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
            for header in response.headers.get_all("Set-Cookie") or []:
                name, _, rest = header.partition("=")
                if name == COOKIE:
                    value = rest.partition(";")[0]
                    self.cookie = None if "Max-Age=0" in header else value
            return response.status, text
        finally:
            conn.close()

    def token(self) -> str:
        """The form token of the page this browser is shown now."""
        status, page = self.request("GET", "/")
        assert status == 200
        found = re.findall(r'name="csrf" value="([0-9a-f]{64})"', page)
        assert found and len(set(found)) == 1, page  # every form, the one token
        return found[0]

    def signed_in_as(self) -> str | None:
        found = re.search(r'<p id="me">Signed in as <b>([^<]*)</b>', self.request("GET", "/")[1])
        return found.group(1) if found else None


def password_hash(loop: dict, username: str) -> bytes:
    with sqlite3.connect(loop["platform_db"]) as conn:
        return conn.execute("SELECT hash FROM accounts WHERE username = ?", (username,)).fetchone()[0]


def test_the_platform_refuses_a_post_from_another_origin_or_without_the_form_token(loop):
    port = loop["ports"]["platform"]
    own = f"http://127.0.0.1:{port}"
    alice = Client(port, own)
    assert alice.request("POST", "/signup", {"username": "alice", "password": "correct horse alice",
                                             "csrf": alice.token()})[0] == 303
    assert alice.signed_in_as() == "alice"
    before = password_hash(loop, "alice")
    change = {"current_password": "correct horse alice", "new_password": "a brand new password"}

    # Everything right but the Origin: another port of this host, another host, "null", none at all.
    for origin in (f"http://127.0.0.1:{port + 1}", "http://localhost:" + str(port), "null", "-"):
        status, text = alice.request("POST", "/password", change | {"csrf": alice.token()}, origin=origin)
        assert (status, text) == (403, "Refused: a POST must come from this platform's own pages.\n"), origin
        status, text = alice.request("POST", "/token", origin=origin)
        assert status == 403 and "game_auth_token" not in text, origin
    assert password_hash(loop, "alice") == before

    # Everything right but the form token: none, another's, the one of an earlier session, a forged one.
    stranger = Client(port, own)
    earlier = alice.token()
    assert alice.request("POST", "/signin", {"username": "alice", "password": "correct horse alice",
                                             "csrf": earlier})[0] == 303  # a new session: a new token
    assert alice.token() != earlier
    for token in ("", stranger.token(), earlier, "0" * 64, "é"):
        status, text = alice.request("POST", "/password", change | {"csrf": token})
        assert status == 403 and "This page was out of date (a sign-in or sign-out in another tab?): try again." in text
    assert password_hash(loop, "alice") == before

    # Everything right but the current password; then all of it right (the control).
    status, text = alice.request("POST", "/password", change | {"current_password": "a guess", "csrf": alice.token()})
    assert status == 200 and "The current password is wrong." in text
    assert password_hash(loop, "alice") == before and alice.signed_in_as() == "alice"
    assert alice.request("POST", "/password", change | {"csrf": alice.token()})[0] == 303
    assert password_hash(loop, "alice") != before and alice.signed_in_as() == "alice"


def test_a_sign_in_needs_the_form_token_of_the_browser_that_sends_it(loop):
    """Login CSRF: the attacker's own credentials posted from a signed-out browser. Without this browser's
    token (here: the token of the attacker's own cookie) nobody is signed in."""
    port = loop["ports"]["platform"]
    own = f"http://127.0.0.1:{port}"
    mallory = Client(port, own)
    assert mallory.request("POST", "/signup", {"username": "mallory", "password": "correct horse mallory",
                                               "csrf": mallory.token()})[0] == 303
    victim = Client(port, own)
    victim.token()  # the victim's browser has been to the platform: its own signed-out cookie
    credentials = {"username": "mallory", "password": "correct horse mallory"}
    for token in ("", mallory.token()):
        status, _ = victim.request("POST", "/signin", credentials | {"csrf": token})
        assert status == 403 and victim.signed_in_as() is None
    assert victim.request("POST", "/signin", credentials | {"csrf": victim.token()})[0] == 303  # the control
    assert victim.signed_in_as() == "mallory"
