"""The client examples of docs/admin-api.md ("Calling it from the web tier"), run as written: each
fenced block with a ``title="..."`` is written to a file and driven by the language's own runtime
against the admin API under a real gunicorn on loopback: signup, rename with If-Match, ban, mint,
revoke, and the errors a caller meets (the problem+json body in an AdminError, never the token).

Node and PHP come from the OS (.ci/run installs nodejs, php-cli and php-curl); without one, its
tests go through skip_or_fail (failures under AUTHSVC_TEST_STRICT=1, as in CI).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from tests.support import free_port, skip_or_fail, start_gunicorn, wait_for_port

pytestmark = pytest.mark.engine(
    "sqlite"
)  # the examples speak HTTP; the engine is not theirs to test

DOC = Path(__file__).resolve().parents[2] / "docs" / "admin-api.md"
BLOCK = re.compile(r'^```(\w+) title="([^"]+)"\n(.*?)^```$', re.M | re.S)

NODE_DRIVER = """
const client = require("./admin-client.js");
const print = (step, value) => console.log(JSON.stringify({ step, value }));
async function expectError(step, call) {
  try { await call(); print(step, "no error"); }
  catch (error) {
    print(step, { isAdminError: error instanceof client.AdminError, status: error.status,
                  type: error.problem.type, detail: error.problem.detail, message: error.message });
  }
}
(async () => {
  const player = await client.signup(GAME_USER, "newbie");
  print("signup", player);
  await expectError("taken signup", () => client.signup(GAME_USER, "other"));
  print("rename", await client.rename(GAME_USER, "veteran", true, player.etag));
  await expectError("stale rename", () => client.rename(GAME_USER, "again", true, player.etag));
  print("ban", await client.ban(GAME_USER, "veteran"));
  await expectError("mint banned", () => client.mint(GAME_ID, GAME_USER));
  print("unban", await client.ban(GAME_USER, "veteran", false));
  print("mint", await client.mint(GAME_ID, GAME_USER));
  print("revoke", await client.revoke(GAME_USER));
  print("mint again", await client.mint(GAME_ID, GAME_USER));
  await expectError("bad name", () => client.signup(GAME_USER + 1, " "));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""

PYTHON_DRIVER = """
import json
from admin_client import AdminError, ban, mint, rename, revoke, signup

def show(step, value):
    print(json.dumps({"step": step, "value": value}))

def expect_error(step, call):
    try:
        call()
        show(step, "no error")
    except AdminError as error:
        show(step, {"isAdminError": True, "status": error.status, "type": error.problem.get("type"),
                    "detail": error.problem.get("detail"), "message": str(error)})

player = signup(GAME_USER, "newbie")
show("signup", player)
expect_error("taken signup", lambda: signup(GAME_USER, "other"))
show("rename", rename(GAME_USER, "veteran", etag=player["etag"]))
expect_error("stale rename", lambda: rename(GAME_USER, "again", etag=player["etag"]))
show("ban", ban(GAME_USER, "veteran"))
expect_error("mint banned", lambda: mint(GAME_ID, GAME_USER))
show("unban", ban(GAME_USER, "veteran", banned=False))
show("mint", mint(GAME_ID, GAME_USER))
show("revoke", revoke(GAME_USER))
show("mint again", mint(GAME_ID, GAME_USER))
expect_error("bad name", lambda: signup(GAME_USER + 1, " "))
"""

PHP_DRIVER = """<?php
require __DIR__ . '/admin-client.php';

use Authsvc\\Admin\\AdminError;
use function Authsvc\\Admin\\{ban, mint, rename, revoke, signup};

function show(string $step, $value): void
{
    echo json_encode(['step' => $step, 'value' => $value]), "\\n";
}

function expectError(string $step, callable $call): void
{
    try {
        $call();
        show($step, 'no error');
    } catch (AdminError $error) {
        show($step, ['isAdminError' => true, 'status' => $error->status,
                     'type' => $error->problem['type'] ?? null,
                     'detail' => $error->problem['detail'] ?? null,
                     'message' => $error->getMessage()]);
    }
}

$player = signup(GAME_USER, 'newbie');
show('signup', $player);
expectError('taken signup', fn () => signup(GAME_USER, 'other'));
show('rename', rename(GAME_USER, 'veteran', true, $player['etag']));
expectError('stale rename', fn () => rename(GAME_USER, 'again', true, $player['etag']));
show('ban', ban(GAME_USER, 'veteran'));
expectError('mint banned', fn () => mint(GAME_ID, GAME_USER));
show('unban', ban(GAME_USER, 'veteran', false));
show('mint', mint(GAME_ID, GAME_USER));
show('revoke', revoke(GAME_USER));
show('mint again', mint(GAME_ID, GAME_USER));
expectError('bad name', fn () => signup(GAME_USER + 1, ' '));
"""

# Every notice, warning and deprecation on stderr whatever the machine's php.ini says: the PHP test
# wants stderr empty, so a PHP release that deprecates a call of the client fails here first.
PHP_FLAGS = ("-d", "error_reporting=-1", "-d", "display_errors=stderr", "-d", "log_errors=0")


def php_command() -> list[str]:
    """php with the curl extension, or skip_or_fail naming the Debian packages."""
    php = shutil.which("php")
    if php is None:
        skip_or_fail("php is not installed (.ci/run installs php-cli and php-curl)")
    done = subprocess.run(
        [php, "-r", "exit(function_exists('curl_init') ? 0 : 1);"], capture_output=True, timeout=60
    )
    if done.returncode != 0:
        skip_or_fail("php has no curl extension (.ci/run installs php-curl)")
    return [php, *PHP_FLAGS]


def examples() -> dict[str, str]:
    """The titled fenced blocks of docs/admin-api.md, by title."""
    return {title: code for _, title, code in BLOCK.findall(DOC.read_text())}


@pytest.fixture
def live_admin(env, admin_store, world):
    """start(**env) -> (url, API token, game id, gunicorn): the admin API under gunicorn on
    127.0.0.1 with a web-tier token, its access log on stdout."""
    _, token = api_tokens.add_api_token(
        admin_store, Context(actor="cli:test"), "web-tier", ["players:write", "tokens:mint"]
    )
    servers = []

    def start(**extra_env):
        port = free_port()
        servers.append(
            start_gunicorn(
                env | extra_env,
                "--access-logfile",
                "-",
                port=port,
                app="authsvc.api.wsgi:application",
                workers=1,
            )
        )
        wait_for_port(port)
        return f"http://127.0.0.1:{port}", token, world.game_id, servers[-1]

    yield start
    for server in servers:
        if server.poll() is None:
            server.terminate()
            server.communicate(timeout=30)


def run_client(
    command: list[str], workdir: Path, url: str, token: str, quiet: bool = False
) -> dict:
    """Run the driver; its printed steps by name (bounded: a hung call fails the test, not the run).
    ``quiet``: nothing may be printed on stderr either (PHP's notices and deprecations go there)."""
    env = {"PATH": "/usr/bin:/bin", "AUTHSVC_ADMIN_URL": url, "AUTHSVC_ADMIN_TOKEN": token}
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    assert not quiet or done.stderr == "", done.stderr
    assert token not in done.stdout and token not in done.stderr
    return {line["step"]: line["value"] for line in map(json.loads, done.stdout.splitlines())}


def assert_the_calls_went_through(steps: dict, game_id: int) -> None:
    assert steps["signup"]["user_id"] == 777 and steps["signup"]["username"] == "newbie"
    assert steps["signup"]["epoch"] == 0 and steps["signup"]["etag"]
    taken = steps["taken signup"]  # If-None-Match: *, the id taken: 412, nothing renamed
    assert (
        taken["isAdminError"]
        and taken["status"] == 412
        and taken["detail"] == "player 777 exists (If-None-Match: *)"
    )
    assert (
        steps["rename"]["username"] == "veteran"
        and steps["rename"]["etag"] != steps["signup"]["etag"]
    )
    stale = steps["stale rename"]  # If-Match with the first ETag: 412, read as problem+json
    assert stale["isAdminError"] and stale["status"] == 412
    assert stale["type"] == "urn:authsvc:problem:precondition-failed"
    assert steps["ban"]["enabled"] is False and steps["ban"]["username"] == "veteran"
    banned = steps["mint banned"]
    assert banned["status"] == 404 and banned["type"] == "urn:authsvc:problem:not-found"
    assert steps["unban"]["enabled"] is True
    minted = steps["mint"]
    assert minted["game_id"] == game_id and minted["epoch"] == 0
    assert re.fullmatch(r"[0-9a-f]{64}", minted["game_auth_token"])
    assert steps["revoke"]["epoch"] == 1 and steps["revoke"]["effective_by"]
    assert steps["mint again"]["epoch"] == 1
    assert steps["mint again"]["game_auth_token"] != minted["game_auth_token"]
    bad = steps["bad name"]
    assert bad["status"] == 422 and bad["type"] == "urn:authsvc:problem:validation"
    assert (
        "white space" in bad["detail"]
        and bad["detail"] in bad["message"]
        and "422" in bad["message"]
    )


def test_the_docs_hold_a_client_per_language():
    assert set(examples()) >= {"admin_client.py", "admin-client.js", "admin-client.php"}


def test_the_node_client_as_documented(live_admin, tmp_path):
    node = shutil.which("node")
    if node is None:
        skip_or_fail("node is not installed (.ci/run installs nodejs)")
    url, token, game_id, _ = live_admin()
    (tmp_path / "admin-client.js").write_text(examples()["admin-client.js"])
    driver = NODE_DRIVER.replace("GAME_USER", "777").replace("GAME_ID", str(game_id))
    (tmp_path / "driver.js").write_text(driver)
    assert_the_calls_went_through(run_client([node, "driver.js"], tmp_path, url, token), game_id)


def test_the_php_client_as_documented(live_admin, tmp_path):
    php = php_command()
    url, token, game_id, _ = live_admin()
    (tmp_path / "admin-client.php").write_text(examples()["admin-client.php"])
    driver = PHP_DRIVER.replace("GAME_USER", "777").replace("GAME_ID", str(game_id))
    (tmp_path / "driver.php").write_text(driver)
    assert_the_calls_went_through(
        run_client([*php, "driver.php"], tmp_path, url, token, quiet=True), game_id
    )


def test_the_python_client_as_documented(live_admin, tmp_path):
    url, token, game_id, _ = live_admin()
    (tmp_path / "admin_client.py").write_text(examples()["admin_client.py"])
    driver = PYTHON_DRIVER.replace("GAME_USER", "777").replace("GAME_ID", str(game_id))
    (tmp_path / "driver.py").write_text(driver)
    assert_the_calls_went_through(
        run_client([sys.executable, "driver.py"], tmp_path, url, token), game_id
    )


@pytest.mark.parametrize("language", ["node", "php", "python"])
def test_the_clients_wait_out_retry_after_and_try_again(language, live_admin, tmp_path):
    """One request a second, no burst: the second call is answered 429 with Retry-After: 1; the
    client waits and its second try passes. (A 503 takes the same branch of each client.)"""
    if language == "node":
        if shutil.which("node") is None:
            skip_or_fail("node is not installed (.ci/run installs nodejs)")
        (tmp_path / "admin-client.js").write_text(examples()["admin-client.js"])
        (tmp_path / "driver.js").write_text(
            'const c = require("./admin-client.js");\n(async () => { await c.signup(5, "first"); '
            'console.log(JSON.stringify(await c.rename(5, "second"))); })()'
            ".catch((error) => { console.error(String(error)); process.exit(1); });\n"
        )
        command = [shutil.which("node") or "node", "driver.js"]
    elif language == "php":
        php = php_command()
        (tmp_path / "admin-client.php").write_text(examples()["admin-client.php"])
        (tmp_path / "driver.php").write_text(
            "<?php\nrequire __DIR__ . '/admin-client.php';\nAuthsvc\\Admin\\signup(5, "
            "'first');\necho json_encode(Authsvc\\Admin\\rename(5, 'second'));\n"
        )
        command = [*php, "driver.php"]
    else:
        (tmp_path / "admin_client.py").write_text(examples()["admin_client.py"])
        (tmp_path / "driver.py").write_text(
            "import json\nfrom admin_client import rename, signup\n"
            'signup(5, "first")\nprint(json.dumps(rename(5, "second")))\n'
        )
        command = [sys.executable, "driver.py"]
    url, token, _, server = live_admin(AUTHSVC_ADMIN_RATE="1", AUTHSVC_ADMIN_BURST="1")
    env = {"PATH": "/usr/bin:/bin", "AUTHSVC_ADMIN_URL": url, "AUTHSVC_ADMIN_TOKEN": token}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["username"] == "second"
    server.terminate()
    log, _ = server.communicate(timeout=30)
    statuses = [
        line.split('"')[2].split()[0] for line in log.splitlines() if "/v1/players/5" in line
    ]
    assert statuses[0] in ("200", "201") and "429" in statuses and statuses[-1] == "200"
