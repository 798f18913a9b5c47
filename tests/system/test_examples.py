"""The demo platform and the reference game (examples/, docs/integrating.md) on real processes,
without a browser: what a copy of them must keep. The browser's view of the same is
tests/integration/test_integration_browser.py.

The platform refuses a POST from any other origin and a form without the token tied to the session
cookie, each on its own; a password change needs the current password. The game limits link attempts
(a password guess each) per player and per account, and checks the password outside its one lock.
"""

from __future__ import annotations

import http.client
import json
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from examples.game.server import Attempts, password_hash
from tests.demo_support import REPO, admin_call, demo_loop

pytestmark = pytest.mark.slow
COOKIE = "demo_platform_session"


@pytest.fixture
def loop(tmp_path, secret_file):
    with demo_loop(tmp_path, secret_file) as servers:
        yield servers


class Client:
    """A browser's requests to the platform, by hand: its one cookie, and the Origin header it
    sends."""

    def __init__(self, port: int, origin: str):
        self.port, self.origin, self.cookie = port, origin, None

    def request(
        self, method: str, path: str, form: dict | None = None, origin: str | None = None
    ) -> tuple[int, str]:
        headers = {"Cookie": f"{COOKIE}={self.cookie}"} if self.cookie else {}
        if method == "POST" and (origin or self.origin) != "-":  # "-": no Origin header at all
            headers["Origin"] = origin or self.origin
        body = None
        if form is not None:
            body, headers["Content-Type"] = (
                urllib.parse.urlencode(form),
                "application/x-www-form-urlencoded",
            )
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


def stored_hash(loop: dict, username: str) -> bytes:
    with sqlite3.connect(loop["platform_db"]) as conn:
        return conn.execute("SELECT hash FROM accounts WHERE username = ?", (username,)).fetchone()[
            0
        ]


def test_the_platform_refuses_a_post_from_another_origin_or_without_the_form_token(loop):
    port = loop["ports"]["platform"]
    own = f"http://127.0.0.1:{port}"
    alice = Client(port, own)
    assert (
        alice.request(
            "POST",
            "/signup",
            {"username": "alice", "password": "correct horse alice", "csrf": alice.token()},
        )[0]
        == 303
    )
    assert alice.signed_in_as() == "alice"
    before = stored_hash(loop, "alice")
    change = {"current_password": "correct horse alice", "new_password": "a brand new password"}

    # Everything right but the Origin: another port of this host, another host, "null", none at all.
    for origin in (f"http://127.0.0.1:{port + 1}", "http://localhost:" + str(port), "null", "-"):
        status, text = alice.request(
            "POST", "/password", change | {"csrf": alice.token()}, origin=origin
        )
        assert (status, text) == (
            403,
            "Refused: a POST must come from this platform's own pages.\n",
        ), origin
        status, text = alice.request("POST", "/token", origin=origin)
        assert status == 403 and "game_auth_token" not in text, origin
    assert stored_hash(loop, "alice") == before

    # Everything right but the form token: none, another's, the one of an earlier session, a forged
    # one.
    stranger = Client(port, own)
    earlier = alice.token()
    assert (
        alice.request(
            "POST",
            "/signin",
            {"username": "alice", "password": "correct horse alice", "csrf": earlier},
        )[0]
        == 303
    )  # a new session: a new token
    assert alice.token() != earlier
    for token in ("", stranger.token(), earlier, "0" * 64, "é"):
        status, text = alice.request("POST", "/password", change | {"csrf": token})
        assert (
            status == 403
            and "This page was out of date (a sign-in or sign-out in another tab?): try again."
            in text
        )
    assert stored_hash(loop, "alice") == before

    # Everything right but the current password; then all of it right (the control).
    status, text = alice.request(
        "POST", "/password", change | {"current_password": "a guess", "csrf": alice.token()}
    )
    assert status == 200 and "The current password is wrong." in text
    assert stored_hash(loop, "alice") == before and alice.signed_in_as() == "alice"
    assert alice.request("POST", "/password", change | {"csrf": alice.token()})[0] == 303
    assert stored_hash(loop, "alice") != before and alice.signed_in_as() == "alice"


def test_a_sign_in_needs_the_form_token_of_the_browser_that_sends_it(loop):
    """Login CSRF: the attacker's own credentials posted from a signed-out browser. Without this
    browser's token (here: the token of the attacker's own cookie) nobody is signed in."""
    port = loop["ports"]["platform"]
    own = f"http://127.0.0.1:{port}"
    mallory = Client(port, own)
    assert (
        mallory.request(
            "POST",
            "/signup",
            {"username": "mallory", "password": "correct horse mallory", "csrf": mallory.token()},
        )[0]
        == 303
    )
    victim = Client(port, own)
    victim.token()  # the victim's browser has been to the platform: its own signed-out cookie
    credentials = {"username": "mallory", "password": "correct horse mallory"}
    for token in ("", mallory.token()):
        status, _ = victim.request("POST", "/signin", credentials | {"csrf": token})
        assert status == 403 and victim.signed_in_as() is None
    assert (
        victim.request("POST", "/signin", credentials | {"csrf": victim.token()})[0] == 303
    )  # the control
    assert victim.signed_in_as() == "mallory"


# -- the reference game's /api/link: a password check, so guesses are limited and hashed outside the
# lock ----


def platform_player(loop: dict, user_id: int, username: str) -> dict:
    """A player signed up on the platform, with its token for the game (as the platform's page gets
    it)."""
    admin_call(loop, "PUT", f"/v1/players/{user_id}", {"username": username})
    minted = admin_call(
        loop, "POST", "/v1/tokens", {"game_id": loop["game_id"], "user_id": user_id}
    )
    return {"user_id": user_id, "game_auth_token": minted["game_auth_token"]}


def game_call(loop: dict, path: str, body: dict) -> tuple[int, dict, str | None]:
    """One call of the game's own API, as its page makes it: (HTTP status, JSON answer,
    Retry-After)."""
    conn = http.client.HTTPConnection("127.0.0.1", loop["ports"]["game"], timeout=30)
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Retry-After")
    finally:
        conn.close()


def add_game_account(loop: dict, name: str, password: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "examples.game", "--db", str(loop["game_db"]), "add-account", name],
        cwd=REPO,
        input=password + "\n",
        text=True,
        check=True,
        timeout=60,
    )


def test_link_guesses_beyond_the_limits_are_refused_with_429(loop):
    """The game's defaults: 5 link attempts per platform player and 10 per game account in 5
    minutes. One player guessing as fast as it can (for 8 s, at most 200 guesses) gets 5 checked and
    the rest refused; other players guessing the same account stop at its 10, and then even the
    right password waits."""
    add_game_account(loop, "oldhero", "hero password")
    guesser = platform_player(loop, 2001, "guesser")
    answers: list[tuple[int, str, str | None]] = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and len(answers) < 200:
        status, answer, retry_after = game_call(
            loop, "/api/link", guesser | {"name": "oldhero", "password": f"guess {len(answers)}"}
        )
        answers.append((status, answer["status"], retry_after))
    checked = [a for a in answers if a[:2] == (200, "link-refused")]
    refused = [a for a in answers if a[:2] == (429, "too-many-attempts")]
    print(
        f"one player: {len(answers)} guesses, {len(checked)} checked, {len(refused)} refused (429)"
    )
    assert len(checked) == 5 and len(refused) == len(answers) - 5 and len(answers) > 5
    assert all(1 <= int(retry_after or 0) <= 300 for _, _, retry_after in refused)

    # The same account from other players: the account's limit (10) holds across them.
    helpers = [platform_player(loop, 2002 + i, f"helper{i}") for i in range(3)]
    statuses = [
        game_call(loop, "/api/link", helper | {"name": "oldhero", "password": f"guess {i}"})[1][
            "status"
        ]
        for helper in helpers
        for i in range(5)
    ]
    assert statuses == ["link-refused"] * 5 + ["too-many-attempts"] * 10, statuses
    owner = platform_player(loop, 2010, "owner")
    status, answer, retry_after = game_call(
        loop, "/api/link", owner | {"name": "oldhero", "password": "hero password"}
    )
    assert (status, answer["status"]) == (429, "too-many-attempts") and retry_after is not None
    # A name or password JSON can hold but no account can (a lone surrogate) is refused as any wrong
    # one.
    status, answer, _ = game_call(
        loop, "/api/link", owner | {"name": "old\ud800hero", "password": "x"}
    )
    assert (status, answer["status"]) == (200, "link-refused")
    status, answer, _ = game_call(
        loop, "/api/link", owner | {"name": "oldwizard", "password": "\ud800"}
    )
    assert (status, answer["status"]) == (200, "link-refused")
    # Another account is not held by this one's limit.
    add_game_account(loop, "oldwizard", "wizard password")
    status, answer, _ = game_call(
        loop, "/api/link", owner | {"name": "oldwizard", "password": "wizard password"}
    )
    assert (status, answer["status"], answer["account"]["name"]) == (200, "linked", "oldwizard")


def test_attempts_count_per_key_in_a_sliding_window_in_bounded_memory():
    """The game's counter (examples/game/server.py, Attempts) on a clock of the test's."""
    now = [0.0]
    attempts = Attempts({"player": 2, "account": 3}, window=10, max_keys=5, clock=lambda: now[0])
    assert [attempts.take([("player", 1), ("account", "x")]) for _ in range(3)] == [
        0,
        0,
        10,
    ]  # the player's 2
    now[0] = 4
    assert attempts.take([("player", 2), ("account", "x")]) == 0  # the account's third
    assert (
        attempts.take([("player", 3), ("account", "x")]) == 6
    )  # the account is full: its first frees at 10
    assert (
        attempts.take([("player", 3), ("account", "y")]) == 0
    )  # a refused attempt counted for nobody
    now[0] = 10
    assert attempts.take([("player", 1), ("account", "y")]) == 0  # player 1's first left the window
    # Five keys hold attempts in their window: a sixth is refused for a window, not an old one
    # forgotten.
    assert attempts.take([("player", 4), ("account", "y")]) == 10
    now[0] = (
        14.5  # the attempts made at 4 have left the window, and their keys with them: room again
    )
    assert attempts.take([("player", 4), ("account", "y")]) == 0 and len(attempts.seen) == 3

    # Many at once from one player: exactly its limit gets through (counted before any hash runs).
    attempts = Attempts({"player": 5, "account": 10}, window=300)
    results: list[float] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(attempts.take([("player", 9), ("account", "z")]))
        )
        for _ in range(40)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 40 and results.count(0) == 5


@pytest.fixture
def unlimited_loop(tmp_path, secret_file):
    """The loop with the game's link limits out of the way, to measure what a password check costs
    others."""
    with demo_loop(tmp_path, secret_file, game_args=LINK_LIMITS_OFF) as servers:
        yield servers


LINK_LIMITS_OFF = (
    "--link-attempts-per-player",
    "1000000",
    "--link-attempts-per-account",
    "1000000",
)


def test_a_link_check_does_not_hold_up_another_players_play(unlimited_loop):
    """Guesses at link passwords back to back from two connections (a password hash each, the limits
    off) while another player plays: that player's median play is compared with its median beside
    the same load of hashes run outside the game (two threads of this test), so what is left is what
    the game's lock costs: at most half of one hash (15 ms at least). Under the game's one lock it
    waited for the hashes in progress: 4 ms became 166 in the finding. Three rounds of each,
    interleaved, as the machine's load drifts."""
    loop = unlimited_loop
    add_game_account(loop, "oldhero", "hero password")
    guesser, player = platform_player(loop, 2001, "guesser"), platform_player(loop, 2002, "player")
    assert game_call(loop, "/api/login", player)[1]["status"] == "new"
    hash_ms = statistics.median(
        timed_ms(lambda: password_hash("a guess", b"0" * 16)) for _ in range(5)
    )
    guesses = []

    def guess() -> None:
        assert (
            game_call(loop, "/api/link", guesser | {"name": "oldhero", "password": "a guess"})[0]
            == 200
        )
        guesses.append(1)

    quiet = plays_ms(loop, player, 20)
    beside, guessing = [], []
    for _ in range(3):
        beside += plays_ms(loop, player, 20, load=lambda: password_hash("a guess", b"0" * 16))
        guessing += plays_ms(loop, player, 20, load=guess)
    quiet_ms, beside_ms, guessing_ms = (statistics.median(t) for t in (quiet, beside, guessing))
    print(
        f"another player's median play: {quiet_ms:.1f} ms quiet, {beside_ms:.1f} ms beside hashes "
        f"outside the game, {guessing_ms:.1f} ms during {len(guesses)} link checks (a hash: "
        f"{hash_ms:.0f} ms)"
    )
    assert len(guesses) >= 6
    assert guessing_ms <= beside_ms + max(15.0, hash_ms / 2), (beside_ms, guessing_ms, hash_ms)


def plays_ms(loop: dict, player: dict, plays: int, load=None) -> list[float]:
    """How long each of ``plays`` plays took, in ms, with ``load()`` called back to back in two
    threads meanwhile."""
    stop = threading.Event()

    def loaded() -> None:
        deadline = time.monotonic() + 60  # a bound, should the test fail before it sets stop
        while not stop.is_set() and time.monotonic() < deadline:
            load()

    threads = [threading.Thread(target=loaded) for _ in range(2 if load else 0)]
    took = []
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.2 if load else 0)
        for _ in range(plays):
            took.append(timed_ms(lambda: played(loop, player)))
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    return took


def played(loop: dict, player: dict) -> None:
    status, answer, _ = game_call(loop, "/api/play", player)
    assert (status, answer["status"]) == (200, "played"), answer


def timed_ms(work) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1000
