"""A game developer's whole loop (docs/integrating.md), as a player meets it, in headless Chromium.

Real processes on loopback (tests/demo_support.py): authsvc's game-facing gunicorn and its admin API
gunicorn (one SQLite store, a game and an admin API token made with the real ``authsvc`` command),
the demo platform (examples/platform/) and the reference game server (examples/game/). The browser
is the OS's Chromium (Debian: apt-get install chromium), driven by Playwright; .ci/run installs it.
Each step leaves a screenshot in the test's tmp_path, named in the failure message.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from harness.processes import stop
from tests.demo_support import demo_loop
from tests.support import free_port, get_text, skip_or_fail, store_sql, wait_for_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 20_000  # a bound for each step on a loaded machine, not a timing assertion

pytestmark = pytest.mark.slow


@pytest.fixture
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("playwright is not installed (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        skip_or_fail(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def loop(tmp_path, secret_file):
    """The four servers (tests/demo_support.py), stopped after the test."""
    with demo_loop(tmp_path, secret_file) as servers:
        yield servers


def game_accounts(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT name, platform_user_id FROM accounts ORDER BY id").fetchall()


def test_the_whole_loop_in_a_real_browser(browser, loop, tmp_path):
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    step = ["start"]

    def shot(name: str) -> None:
        step[0] = name
        page.screenshot(
            path=str(tmp_path / f"step-{len(list(tmp_path.glob('step-*.png'))):02d}-{name}.png")
        )

    game = page.frame_locator("#game")
    status = game.locator("#status")

    def sign_up(username: str) -> None:
        page.fill("#signup input[name=username]", username)
        page.fill("#signup input[name=password]", "correct horse " + username)
        page.click("#signup button")

    try:
        # A guest: the account-required message and the sign-in button, which leads to the platform.
        page.goto(loop["platform_url"])
        expect(game.locator("#guest")).to_contain_text("An account is required", timeout=WAIT_MS)
        expect(game.locator("#signin")).to_be_visible()
        assert game.locator("#signin").get_attribute("href") == loop["platform_url"]
        shot("guest")

        # Sign up: the game creates its account (platform user id and username).
        sign_up("alice")
        expect(page.locator("#me")).to_contain_text("alice", timeout=WAIT_MS)
        expect(status).to_have_text("New account created: alice", timeout=WAIT_MS)
        shot("created")
        (alice,) = game_accounts(loop["game_db"])
        assert alice[0] == "alice" and alice[1] >= 1001
        # Neither the api key nor the admin token ever reaches the browser.
        for frame in page.frames:
            assert not [s for s in loop["secrets"] if s in frame.content()]

        # Reload: the same account, looked up by platform user id; none added.
        page.reload()
        expect(status).to_have_text("Welcome back, alice (logged in)", timeout=WAIT_MS)
        game.locator("#play").click()
        expect(game.locator("#coins")).to_have_text("1", timeout=WAIT_MS)
        assert game_accounts(loop["game_db"]) == [alice]

        # The password changes in another tab while this one's game holds the old token: its next
        # call is refused (403) and the game asks for a reload. The game's own Reload button asks
        # the platform page for a fresh token (authsvc-platform.js's refresh), and the player is
        # logged in again, no loop: the next coin counts, no reload asked.
        other = context.new_page()
        other.goto(loop["platform_url"])
        other.fill("#password input[name=current_password]", "correct horse alice")
        other.fill("#password input[name=new_password]", "a brand new password")
        other.click("#password button")
        expect(other.locator("#me")).to_contain_text("alice", timeout=WAIT_MS)
        other.close()
        game.locator("#play").click()
        expect(status).to_contain_text("Please reload the page", timeout=WAIT_MS)
        expect(game.locator("#reload")).to_be_visible()
        shot("reload-asked")
        game.locator("#reload button").click()
        expect(status).to_have_text("Welcome back, alice (logged in)", timeout=WAIT_MS)
        expect(game.locator("#reload")).to_be_hidden()
        expect(game.locator("#coins")).to_have_text("1")
        game.locator("#play").click()
        expect(status).to_have_text("A coin!", timeout=WAIT_MS)
        expect(game.locator("#coins")).to_have_text("2")
        shot("reloaded")

        # Sign out on the platform: the game shows the account-required message again.
        page.click("#signout button")
        expect(game.locator("#guest")).to_contain_text("An account is required", timeout=WAIT_MS)
        expect(game.locator("#playing")).to_be_hidden()

        # Linking: a player with a game account of the game's own links it; later visits log in to
        # it.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "examples.game",
                "--db",
                str(loop["game_db"]),
                "add-account",
                "oldhero",
            ],
            cwd=REPO,
            input="hero password\n",
            text=True,
            check=True,
            timeout=60,
        )
        sign_up("bob")
        expect(status).to_have_text("New account created: bob", timeout=WAIT_MS)
        game.locator("#link-name").fill("oldhero")
        game.locator("#link-password").fill("not the password")
        game.locator("#link button").click()
        expect(status).to_contain_text("do not match", timeout=WAIT_MS)
        game.locator("#link-password").fill("hero password")
        game.locator("#link button").click()
        expect(status).to_have_text("Linked: you play as oldhero", timeout=WAIT_MS)
        page.reload()
        expect(status).to_have_text("Welcome back, oldhero (logged in)", timeout=WAIT_MS)
        shot("linked")
        names = [name for name, _ in game_accounts(loop["game_db"])]
        assert names == ["alice", "oldhero"]  # bob's first-visit account gave way to the linked one

        # authsvc stops: the game says to try again shortly and keeps the player logged in.
        stop(loop["procs"]["web"])
        game.locator("#play").click()
        expect(status).to_have_text(
            "The login service is busy: try again shortly.", timeout=WAIT_MS
        )
        expect(game.locator("#playing")).to_be_visible()
        expect(game.locator("#who")).to_have_text("oldhero")
        expect(game.locator("#guest")).to_be_hidden()
        expect(game.locator("#reload")).to_be_hidden()
        shot("try-again")
    except Exception as e:
        page.screenshot(path=str(tmp_path / "failure.png"))
        raise AssertionError(f"after step {step[0]!r}: {e}; screenshots in {tmp_path}") from e
    finally:
        context.close()


def test_the_interface_drops_messages_from_another_origin(browser, loop):
    """Both halves of authsvc-platform.js check the origin and the source window: a forged player
    reaches no game, and a hello from another origin gets no token. Messages between two windows
    arrive in the order sent, so a genuine round trip after a forged one shows the forged one was
    dropped."""
    from playwright.sync_api import expect

    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(loop["platform_url"])
        page.fill("#signup input[name=username]", "carol")
        page.fill("#signup input[name=password]", "correct horse carol")
        page.click("#signup button")
        expect(page.frame_locator("#game").locator("#status")).to_have_text(
            "New account created: carol", timeout=WAIT_MS
        )
        game = next(frame for frame in page.frames if frame.url.endswith("/play"))
        game_origin = game.evaluate("location.origin")
        game.evaluate("""() => { window.seen = [];
            window.addEventListener("authsvc:player",
                e => window.seen.push(e.detail && e.detail.user_id)); }""")

        # The game's half: a player from another origin, or from a window other than its parent, is
        # dropped.
        forged = {
            "type": "authsvc:player",
            "player": {"user_id": 666, "username": "mallory", "game_auth_token": "0" * 64},
        }
        game.evaluate(
            """([forged, platform]) => {
            window.dispatchEvent(new MessageEvent("message",
                {data: forged, origin: "http://evil.example", source: parent}));
            window.dispatchEvent(new MessageEvent("message",
                {data: forged, origin: platform, source: window}));
        }""",
            [forged, loop["platform_url"].rstrip("/")],
        )
        assert game.evaluate("window.seen") == []
        game.evaluate(
            """([forged, platform]) => window.dispatchEvent(
            new MessageEvent("message", {data: forged, origin: platform, source: parent}))""",
            [forged, loop["platform_url"].rstrip("/")],
        )
        assert game.evaluate("window.seen") == [
            666
        ]  # the control: the same message from the right place counts

        # The platform's half: a hello or a refresh from another origin, or from another window,
        # gets no answer, and a refresh from there asks the platform's server for nothing (the
        # page's fetch calls are counted: a refresh taken would call it before the genuine hello's
        # answer arrives).
        page.evaluate("""() => { window.fetches = 0; var fetch = window.fetch;
            window.fetch = function () {
                window.fetches++;
                return fetch.apply(this, arguments);
            }; }""")
        post = """([type, origin, own]) => {
            var frame = document.getElementById("game").contentWindow;
            window.dispatchEvent(new MessageEvent("message",
                {data: {type: type}, origin: origin, source: own ? window : frame})); }"""
        for kind in ("authsvc:hello", "authsvc:refresh"):
            page.evaluate(post, [kind, "http://evil.example", False])
            page.evaluate(post, [kind, game_origin, True])
        page.evaluate(
            post, ["authsvc:hello", game_origin, False]
        )  # the genuine one: answered, after any answer above
        game.wait_for_function("window.seen.length >= 2", timeout=WAIT_MS)
        page.evaluate(post, ["authsvc:hello", game_origin, False])
        game.wait_for_function("window.seen.length >= 3", timeout=WAIT_MS)
        seen = game.evaluate("window.seen")
        assert seen[1:] == [seen[1], seen[1]] and len(seen) == 3 and seen[1] != 666, seen
        assert page.evaluate("window.fetches") == 0
        page.evaluate(
            post, ["authsvc:refresh", game_origin, False]
        )  # the control: a genuine refresh asks, and answers
        game.wait_for_function("window.seen.length >= 4", timeout=WAIT_MS)
        assert page.evaluate("window.fetches") == 1 and game.evaluate("window.seen")[3] == seen[1]
    finally:
        context.close()


def test_a_password_change_in_another_browser_ends_at_the_sign_in_not_in_a_loop(browser, loop):
    """A password change signs the player out everywhere else: the game's Reload then finds nobody
    signed in on the platform (the page follows, signed out; the game shows the guest message), and
    signing in again logs the game in."""
    from playwright.sync_api import expect

    here, elsewhere = browser.new_context(), browser.new_context()
    try:
        page = here.new_page()
        status = page.frame_locator("#game").locator("#status")
        page.goto(loop["platform_url"])
        page.fill("#signup input[name=username]", "dave")
        page.fill("#signup input[name=password]", "correct horse dave")
        page.click("#signup button")
        expect(status).to_have_text("New account created: dave", timeout=WAIT_MS)
        other = elsewhere.new_page()
        other.goto(loop["platform_url"])
        other.fill("#signin input[name=username]", "dave")
        other.fill("#signin input[name=password]", "correct horse dave")
        other.click("#signin button")
        other.fill("#password input[name=current_password]", "correct horse dave")
        other.fill("#password input[name=new_password]", "a brand new password")
        other.click("#password button")
        expect(other.locator("#me")).to_contain_text("dave", timeout=WAIT_MS)
        page.frame_locator("#game").locator("#play").click()
        expect(status).to_contain_text("Please reload the page", timeout=WAIT_MS)
        page.frame_locator("#game").locator("#reload button").click()
        expect(page.locator("#signin")).to_be_visible(timeout=WAIT_MS)
        expect(page.frame_locator("#game").locator("#guest")).to_contain_text(
            "An account is required", timeout=WAIT_MS
        )
        page.fill("#signin input[name=username]", "dave")
        page.fill("#signin input[name=password]", "a brand new password")
        page.click("#signin button")
        expect(status).to_have_text("Welcome back, dave (logged in)", timeout=WAIT_MS)
    finally:
        here.close()
        elsewhere.close()


def attack_page(action: str, fields: dict[str, str], how: str, plant_cookie: str = "") -> str:
    """A page of another origin that posts the platform's form ``action`` with ``fields`` as soon as
    it loads: as a form (the browser navigates to the answer) or by a no-cors fetch (the title says
    "sent" when it went); ``plant_cookie`` first sets that cookie from the page, which the browser
    sends to every port."""
    script = f"document.cookie = {json.dumps(plant_cookie + '; path=/')};" if plant_cookie else ""
    if how == "form":
        inputs = "".join(
            f'<input name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields.items()
        )
        return (
            '<!doctype html><form id="f" method="post" '
            f'action="{html.escape(action)}">{inputs}</form>'
            f'<script>{script} document.getElementById("f").submit();</script>'
        )
    return (
        f"<!doctype html><script>{script} fetch({json.dumps(action)}, {{method: 'POST', mode: "
        "'no-cors', credentials: 'include', headers: {'Content-Type': "
        "'application/x-www-form-urlencoded'}, body: "
        f"{json.dumps(urllib.parse.urlencode(fields))}}}).finally(() => {{ document.title = "
        "'sent'; });</script>"
    )


def test_a_page_on_another_port_neither_changes_the_password_nor_signs_the_player_in(
    browser, loop, tmp_path
):
    """Cross-site request forgery from the same host, another port (one site to the browser:
    SameSite=Lax sends the platform's cookie along): a page there posts the password change to a
    signed-in player's browser, and the sign-in with the attacker's own account to a signed-out one
    (login CSRF), each as a form and as a fetch; one sign-in first plants a cookie of its own
    (cookies do not tell ports apart) with the form token the attacker fetched for it, which only
    the Origin check stops. Each is refused: the password and the session stand, nobody is signed
    in."""
    from playwright.sync_api import expect

    platform = loop["platform_url"].rstrip("/")
    attacker_dir, attacker_port = tmp_path / "attacker", free_port()
    attacker_dir.mkdir()
    # The attacker's own pre-session cookie and the form token the platform's page gives it (none
    # before tokens).
    planted = "demo_platform_session=" + "a" * 43
    request = urllib.request.Request(platform + "/", headers={"Cookie": planted})
    with urllib.request.urlopen(request, timeout=10) as response:
        found = re.search(r'name="csrf" value="([^"]*)"', response.read().decode())
    token = {"csrf": found.group(1)} if found else {}
    mallory = {"username": "mallory", "password": "correct horse mallory"}
    pages = {
        "password-form": attack_page(
            platform + "/password",
            {"current_password": "a guess", "new_password": "mallory was here"},
            "form",
        ),
        "password-fetch": attack_page(
            platform + "/password",
            {"current_password": "a guess", "new_password": "mallory was here"},
            "fetch",
        ),
        "signin-form": attack_page(platform + "/signin", mallory, "form"),
        "signin-fetch": attack_page(platform + "/signin", mallory, "fetch"),
        "signin-planted": attack_page(
            platform + "/signin", mallory | token, "form", plant_cookie=planted
        ),
    }
    for name, text in pages.items():
        (attacker_dir / f"{name}.html").write_text(text)
    attacker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            "--directory",
            str(attacker_dir),
            str(attacker_port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    context = browser.new_context()
    try:
        wait_for_port(attacker_port, timeout=30)

        def attack(page, name: str) -> None:
            page.goto(f"http://127.0.0.1:{attacker_port}/{name}.html")
            if name.endswith("fetch"):
                page.wait_for_function("document.title === 'sent'", timeout=WAIT_MS)
            else:
                page.wait_for_url(platform + "/**", timeout=WAIT_MS)

        def password_hash(username: str) -> bytes:
            with sqlite3.connect(loop["platform_db"]) as conn:
                return conn.execute(
                    "SELECT hash FROM accounts WHERE username = ?", (username,)
                ).fetchone()[0]

        for username in (
            "mallory",
            "victim",
        ):  # the attacker's account (signed out after); the victim's, signed in
            page = context.new_page()
            page.goto(loop["platform_url"])
            page.fill("#signup input[name=username]", username)
            page.fill("#signup input[name=password]", "correct horse " + username)
            page.click("#signup button")
            expect(page.locator("#me")).to_contain_text(username, timeout=WAIT_MS)
            if username == "mallory":
                page.click("#signout button")
                expect(page.locator("#signup")).to_be_visible(timeout=WAIT_MS)
        before = password_hash("victim")
        for name in ("password-form", "password-fetch"):
            attack(page, name)
            assert password_hash("victim") == before, name
            page.goto(loop["platform_url"])
            expect(page.locator("#me")).to_contain_text(
                "victim", timeout=WAIT_MS
            )  # the session stands too
        context.close()

        context = (
            browser.new_context()
        )  # a signed-out browser, never at the platform yet: no cookie of its own
        page = context.new_page()
        for name in ("signin-planted", "signin-form", "signin-fetch"):
            attack(page, name)
            page.goto(loop["platform_url"])
            expect(page.locator("#signin")).to_be_visible(timeout=WAIT_MS)
            assert page.locator("#me").count() == 0, name
    finally:
        context.close()
        stop(attacker)


def test_the_demo_command_serves_the_loop(tmp_path):
    """scripts/demo's program (docs/integrating.md, "Run the demo") on free ports: a fresh state
    directory made with the authsvc command, the URL it prints serves the platform page framing the
    game, its deliverer sends the game's webhook a rename, and a SIGTERM stops all five
    processes."""
    ports = {name: free_port() for name in ("authsvc", "admin", "platform", "game")}
    args = [f"--{name}-port={port}" for name, port in ports.items()]
    demo = subprocess.Popen(
        [sys.executable, "-m", "examples.demo", "--var", str(tmp_path / "demo"), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        printed = ""
        while (
            "Ctrl-C" not in printed
        ):  # bounded: the demo exits if a server does not come up in 30 s
            line = demo.stdout.readline()
            assert line, f"the demo stopped: {printed}"
            printed += line
        platform_url = f"http://127.0.0.1:{ports['platform']}/"
        assert platform_url in printed.split()
        status, page = get_text(ports["platform"], "/")
        assert status == 200 and f'src="http://127.0.0.1:{ports["game"]}/play"' in page
        status, game_page = get_text(ports["game"], "/play")
        assert (
            status == 200
            and f'src="http://127.0.0.1:{ports["platform"]}/authsvc-platform.js"' in game_page
        )
        status, answer = get_text(
            ports["authsvc"], "/api/authenticate.json?user_id=1&game_auth_token=x&api_key=y"
        )
        assert status == 200 and json.loads(answer)["error"] == 403
        assert {"api-key", "admin-token", "authsvc.db", "webhook-secret"} <= {
            p.name for p in (tmp_path / "demo").iterdir()
        }
        # Its deliverer sends the game a rename, signed with the secret the game was given: answered
        # 204.
        store = "sqlite://" + str(tmp_path / "demo" / "authsvc.db")
        env = {
            **os.environ,
            "AUTHSVC_STORE": store,
            "AUTHSVC_TOKEN_SECRET_FILE": str(tmp_path / "demo" / "token-secret"),
        }
        for command in (["player", "add", "5", "eve"], ["player", "rename", "5", "eve2"]):
            subprocess.run(
                [str(Path(sys.executable).parent / "authsvc"), *command],
                env=env,
                check=True,
                timeout=60,
            )
        deadline = time.monotonic() + 30
        while store_sql(store, "SELECT state, last_status FROM deliveries") != [("delivered", 204)]:
            assert time.monotonic() < deadline, store_sql(
                store, "SELECT state, last_error FROM deliveries"
            )
            time.sleep(0.1)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(30) == 0
        for port in ports.values():  # every server it started has stopped
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        stop(demo)
        try:  # what it started shares its process group: none outlives a failed run
            os.killpg(demo.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
