"""Upgrade from the previous release, 0.1.0, and roll back to it, as docs/operations.md sections 8
and 9 and CHANGELOG.md ("Migrations and rolling back") say, with 0.1.0's own code: its tree taken
from git, run by this venv's python with PYTHONPATH on it, served by gunicorn with its own
deploy/gunicorn.conf.py and entry point.

0.1.0 makes the store, a game, players and tokens; the runbook's backup; this release's `authsvc
init` migrates and its gunicorn serves 0.1.0's tokens, `authsvc check` and `audit verify` pass.
0.1.0 then refuses the migrated store (its `init`, a fresh start, the running workers' /readyz), so
the pre-upgrade backup goes back with 0.1.0's own steps, under a new token secret, and the players
deleted since the backup are deleted again: no token minted before the roll back authenticates, no
deleted player's name is back, and a token
0.1.0 mints then works. On both engines."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from harness.processes import start_gunicorn, stop
from tests.support import free_port, get, get_text, serve_gunicorn, store_sql

REPO = Path(__file__).resolve().parents[2]
PREVIOUS = (
    "6c9054cc8b55d4a827cb0cd93fb926086c6361d8"  # 0.1.0, the release before this one (CHANGELOG.md)
)
# Schema versions: 0.1.0's and this release's (CHANGELOG.md, "Migrations and rolling back").
SCHEMA = {"sqlite": (8, 12), "postgresql": (9, 14)}
# The tables this release's migrations add (PostgreSQL): 0.1.0's restore drops them with the
# backup's own.
NEW_TABLES = "token_secret_fingerprints, restore_generation"
REFUSED = b'{"success":false,"error":403,"error_description":"Invalid credentials"}'
PLAYERS = {
    1: "anna",
    2: "bert",
    3: "cleopatra",
    4: "dora",
    5: "emil",
}  # 0.1.0 adds 1 to 4, this release 5
NOT_READY = (
    '{"success":false,"error":503,"error_description":"Service temporarily unavailable, try again"}'
)
WAIT = 120  # seconds any one command may take on a busy machine


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory) -> Path:
    """0.1.0's files, out of this clone's history: `git archive` of its commit. A clone without it
    (a shallow one) fails here: the test is never skipped (.ci/run deepens a shallow clone)."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.returncode != 0:
        pytest.fail(
            f"0.1.0 (commit {PREVIOUS}) is not in the clone at {REPO}: a shallow clone? Run "
            f"'git fetch --unshallow' ({found.stderr.strip()})"
        )
    tree = tmp_path_factory.mktemp("authsvc-0.1.0")
    archive = subprocess.Popen(
        ["git", "-C", str(REPO), "archive", PREVIOUS], stdout=subprocess.PIPE
    )
    try:
        subprocess.run(
            ["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True, timeout=WAIT
        )
    finally:
        archive.stdout.close()
        assert archive.wait(WAIT) == 0, "git archive of 0.1.0 failed"
    return tree


class Release:
    """One release's admin command and gunicorn: this one (the editable install), or 0.1.0
    (``tree``: run in it, with it first on sys.path, so its `authsvc` package wins)."""

    def __init__(self, env: dict, tree: Path | None, log_dir: Path):
        self.tree = tree
        self.cwd = (
            tree or REPO
        )  # gunicorn and `python -m` put the working directory first on sys.path
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
        if tree is not None:
            self.env["PYTHONPATH"] = str(tree)
        self.log_dir = log_dir
        self.starts = 0

    @property
    def name(self) -> str:
        return "0.1.0" if self.tree else "this release"

    def command(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        module = "authsvc.admin.command" if self.tree else "authsvc.cli.command"
        done = subprocess.run(
            [sys.executable, "-m", module, *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        if ok:
            assert done.returncode == 0, f"{self.name}: authsvc {' '.join(args)}: {done.stderr}"
        return done

    def json(self, *args: str) -> dict:
        return json.loads(self.command(*args, "--json").stdout)

    def gunicorn_args(self, port: int) -> dict:
        self.starts += 1
        return {
            "port": port,
            "config": self.cwd / "deploy" / "gunicorn.conf.py",
            "workers": 2,
            "inherit_env": False,
            "cwd": self.cwd,
            "new_session": True,
            "app": "authsvc.wsgi:application" if self.tree else "authsvc.wsgi:create_app()",
            "log_path": self.log_dir / f"{self.name.replace(' ', '-')}-{self.starts}.log",
        }

    def serve(self, store: str) -> tuple[subprocess.Popen, int, Path]:
        port = free_port()
        args = self.gunicorn_args(port)
        log = args.pop("log_path")
        proc = serve_gunicorn(
            {**self.env, "AUTHSVC_STORE": store}, port=args.pop("port"), log_path=log, **args
        )
        return proc, port, log


def _answer(port: int, api_key: str, user: int, token: str) -> bytes:
    return get(port, {"user_id": str(user), "game_auth_token": token, "api_key": api_key}).body


def _ok(user: int) -> bytes:
    return f'{{"success":true,"user_id":{user},"username":"{PLAYERS[user]}"}}'.encode()


def _openapi_version(port: int) -> str:
    status, text = get_text(port, "/openapi.json")
    assert status == 200, text
    return json.loads(text)["info"]["version"]


def _counts(url: str) -> tuple[int, int]:
    return (
        store_sql(url, "SELECT count(*) FROM games")[0][0],
        store_sql(url, "SELECT count(*) FROM players")[0][0],
    )


def _holds(store: Store, text: bytes, tmp_path: Path) -> bool:
    """Whether ``text`` is anywhere in the store: in any file of the SQLite store's directory (the
    -wal file and the restore ledger included), or in a pg_dump --data-only of the PostgreSQL
    database."""
    if store.engine == "sqlite":
        state = Path(store.owner.removeprefix("sqlite://")).parent
        return any(text in path.read_bytes() for path in sorted(state.iterdir()) if path.is_file())
    dump = tmp_path / "data.sql"
    subprocess.run(
        ["pg_dump", "--data-only", "--file", str(dump), "--dbname", store.owner],
        check=True,
        capture_output=True,
        timeout=WAIT,
    )
    return text in dump.read_bytes()


def _seconds(started: float) -> float:
    return round(time.monotonic() - started, 2)


@dataclasses.dataclass
class Store:
    """The store under test, not yet made: ``owner`` for the commands (the role that migrates, backs
    up and restores), ``web`` for gunicorn. SQLite: one file. PostgreSQL: a database of its own,
    owned by a role of its own (as deploy/postgres/roles.sql makes authsvc_owner the database's
    owner), served by a login role in authsvc_reader, the role the migrations grant reading to (as
    authsvc_web is)."""

    owner: str
    web: str

    @property
    def engine(self) -> str:
        return "sqlite" if self.owner.startswith("sqlite://") else "postgresql"


def _as(url: str, role: str) -> str:
    """A PostgreSQL URL with another user (no password: the test server trusts loopback)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(
        parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}")
    )


@pytest.fixture
def own_store(store_url, request, tmp_path):
    if store_url.startswith("sqlite://"):
        (tmp_path / "state").mkdir()
        url = f"sqlite://{tmp_path}/state/authsvc.db"
        yield Store(url, url)
        return
    import psycopg

    databases = request.getfixturevalue("pg_databases")
    suffix = secrets.token_hex(5)
    owner, web = f"authsvc_t_owner_{suffix}", f"authsvc_t_web_{suffix}"
    name = None
    with psycopg.connect(databases.server_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN")
        conn.execute(
            "DO $$ BEGIN CREATE ROLE authsvc_reader NOLOGIN; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
        conn.execute(f"CREATE ROLE {web} LOGIN IN ROLE authsvc_reader")
        try:
            url = databases.create(migrate=False, owner=owner)
            name = urllib.parse.urlsplit(url).path.lstrip("/")
            yield Store(_as(url, owner), _as(url, web))
        finally:
            if name is not None:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {web}")
            conn.execute(f"DROP ROLE IF EXISTS {owner}")


def _back_up(previous: Release, url: str, backup: Path) -> None:
    """The runbook's backup before an upgrade from 0.1.0 (docs/operations.md section 9): SQLite,
    0.1.0's own `authsvc backup`; PostgreSQL, pg_dump as the owner (0.1.0's `authsvc backup` copies
    only SQLite)."""
    if url.startswith("sqlite://"):
        previous.command("backup", str(backup))
        return
    refused = previous.command("backup", str(backup), ok=False)
    assert (refused.returncode, refused.stderr) == (
        1,
        "authsvc: error: backup copies a SQLite store; back up "
        "PostgreSQL with pg_dump (docs/operations.md)\n",
    )
    subprocess.run(
        ["pg_dump", "--format=custom", "--no-owner", "--file", str(backup), "--dbname", url],
        check=True,
        capture_output=True,
        timeout=WAIT,
    )


def _restore(previous: Release, url: str, backup: Path) -> str:
    """0.1.0's restore of the pre-upgrade backup, the services stopped (docs/operations.md section
    9, "Back to
    0.1.0"). SQLite: its own section 8, the file put in place and its `authsvc init`. PostgreSQL: as
    the owner, this release's tables dropped, the dump restored over the rest in one transaction,
    then its `authsvc init`. Returns what that `authsvc init` printed (it writes a token secret if
    there is none)."""
    if url.startswith("sqlite://"):
        store = Path(url.removeprefix("sqlite://"))
        subprocess.run(["install", "-m", "600", str(backup), str(store)], check=True, timeout=WAIT)
        for suffix in ("-wal", "-shm"):
            Path(f"{store}{suffix}").unlink(missing_ok=True)
    else:
        listing = backup.with_suffix(".list")
        contents = subprocess.run(
            ["pg_restore", "--list", str(backup)],
            check=True,
            capture_output=True,
            text=True,
            timeout=WAIT,
        ).stdout
        listing.write_text(
            "".join(line + "\n" for line in contents.splitlines() if " ACL pg_catalog " not in line)
        )
        subprocess.run(
            [
                "psql",
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "--dbname",
                url,
                "-c",
                f"DROP TABLE IF EXISTS {NEW_TABLES}",
            ],
            check=True,
            capture_output=True,
            timeout=WAIT,
        )
        done = subprocess.run(
            [
                "pg_restore",
                "--no-owner",
                "--clean",
                "--if-exists",
                "--single-transaction",
                "--exit-on-error",
                f"--use-list={listing}",
                "--dbname",
                url,
                str(backup),
            ],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    initialized = previous.command("init").stdout
    assert "(up to date)" in initialized
    return initialized


def test_upgrade_from_0_1_0_and_roll_back_to_it(previous_tree, own_store, secret_file, tmp_path):
    this_release = importlib.metadata.version("authsvc")  # pyproject.toml's
    engine = own_store.engine
    old_schema, new_schema = SCHEMA[engine]
    env = {
        "AUTHSVC_STORE": own_store.owner,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
    }
    previous = Release(env, previous_tree, tmp_path)
    current = Release(env, None, tmp_path)
    figures: dict[str, object] = {"engine": engine}

    # 0.1.0 is what runs: its own package, its own command (no --version yet), its own store.
    where = subprocess.run(
        [sys.executable, "-c", "import authsvc; print(authsvc.__file__)"],
        env=previous.env,
        cwd=previous.cwd,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    ).stdout
    assert where.strip() == str(previous_tree / "authsvc" / "__init__.py")
    assert 'version = "0.1.0"' in (previous_tree / "pyproject.toml").read_text()
    assert previous.command("--version", ok=False).returncode == 2
    made = previous.json("init")
    assert (made["schema_version_before"], made["schema_version"]) == (0, old_schema)
    game = previous.json("game", "add", "Chess")
    game_id, api_key = game["game_id"], game["api_key"]
    for user in (1, 2, 3, 4):
        previous.command("player", "add", str(user), PLAYERS[user])
    tokens = {
        user: previous.json("token", "issue", "--game", str(game_id), "--user", str(user))[
            "game_auth_token"
        ]
        for user in (1, 2, 3, 4)
    }
    assert previous.json("audit", "verify")["intact"] is True
    old_proc, old_port, _ = previous.serve(own_store.web)
    try:
        assert _openapi_version(old_port) == "1"  # 0.1.0's document; this release's, its version
        for user, token in tokens.items():
            assert _answer(old_port, api_key, user, token) == _ok(user)

        # Back up first (docs/operations.md section 9), while 0.1.0 serves.
        backup = tmp_path / ("before-upgrade.db" if engine == "sqlite" else "before-upgrade.dump")
        backed_up_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        started = time.monotonic()
        _back_up(previous, own_store.owner, backup)
        figures["backup_s"] = _seconds(started)
        assert backup.stat().st_size > 0

        # Upgrade: this release's `authsvc init` migrates.
        started = time.monotonic()
        migrated = current.json("init")
        figures["init_s"] = _seconds(started)
        assert (migrated["schema_version_before"], migrated["schema_version"]) == (
            old_schema,
            new_schema,
        )

        # 0.1.0, still running, compares the version for equality: a worker checks the schema at its
        # first /readyz (none had here), then at most once a minute, and a failed check is not kept:
        # every probe answers 503, while its authentications stay right.
        for _ in range(4):
            assert get_text(old_port, "/readyz") == (503, NOT_READY)
            assert _answer(old_port, api_key, 2, tokens[2]) == _ok(2)
    finally:
        stop(old_proc)

    # This release serves the migrated store: 0.1.0's tokens, its counts, its checks.
    started = time.monotonic()
    new_proc, new_port, _ = current.serve(own_store.web)
    figures["new_start_s"] = _seconds(started)
    try:
        assert _openapi_version(new_port) == this_release
        for user, token in tokens.items():
            assert _answer(new_port, api_key, user, token) == _ok(user)
        assert _counts(own_store.owner) == (1, 4)
        key_file = tmp_path / "api-key"
        key_file.write_text(api_key + "\n")
        checked = current.command(
            "check",
            "--game-id",
            str(game_id),
            "--user-id",
            "2",
            "--api-key-file",
            str(key_file),
            "--base-url",
            f"http://127.0.0.1:{new_port}",
        )
        assert checked.stdout.endswith(f"all 4 checks passed (authsvc {this_release})\n"), (
            checked.stdout
        )
        assert current.json("audit", "verify")["intact"] is True
        # Written after the backup, with this release: player 1 revoked, player 3 deleted, player 5
        # added with a token, player 2 given a new token, then disabled; player 4 untouched.
        current.command("player", "revoke", "1")
        assert _answer(new_port, api_key, 1, tokens[1]) == REFUSED
        current.command("player", "delete", "3")
        assert _answer(new_port, api_key, 3, tokens[3]) == REFUSED
        since_backup = current.json("token", "issue", "--game", str(game_id), "--user", "2")[
            "game_auth_token"
        ]
        assert _answer(new_port, api_key, 2, since_backup) == _ok(2)
        current.command("player", "disable", "2")
        assert _answer(new_port, api_key, 2, since_backup) == REFUSED
        current.command("player", "add", "5", PLAYERS[5])
        tokens[5] = current.json("token", "issue", "--game", str(game_id), "--user", "5")[
            "game_auth_token"
        ]
        assert _answer(new_port, api_key, 5, tokens[5]) == _ok(5)
    finally:
        stop(new_proc)

    # Roll back (docs/operations.md section 9). First, with this release, what changed since the
    # backup (the restore undoes it), and the players deleted since, to delete again.
    since = [
        json.loads(line)
        for line in current.command("audit", "--since", backed_up_at, "--json").stdout.splitlines()
    ]
    changed = {(record["action"], record["user_id"]) for record in since}
    assert {
        ("player.revoke", 1),
        ("player.delete", 3),
        ("player.add", 5),
        ("player.disable", 2),
    } <= changed, since
    deleted = current.command("player", "deleted", "--since", backed_up_at).stdout.split()
    assert deleted == ["3"]
    # 0.1.0's `authsvc init` and a fresh 0.1.0 refuse the migrated store.
    refused = previous.command("init", ok=False)
    assert refused.returncode == 1
    assert f"store schema version {new_schema} is newer than this release" in refused.stderr, (
        refused.stderr
    )
    args = previous.gunicorn_args(free_port())
    log = args.pop("log_path")
    with log.open("wb") as out:
        proc = start_gunicorn(previous.env, stdout=out, stderr=out, **args)
    try:
        assert proc.wait(WAIT) == 4
    finally:
        stop(proc)
    assert (
        f"is at schema version {new_schema}, this release needs {old_schema} (run 'authsvc init')"
        in log.read_text(errors="replace")
    )

    # So the pre-upgrade backup goes back, with 0.1.0's own steps, under a new token secret (the old
    # one moved away; the runbook has 0.1.0's scripts/install write the new one, here its `authsvc
    # init` does, as that installer would), and the players deleted since the backup are deleted
    # again with 0.1.0's `player delete` before it serves.
    old_secret = secret_file.read_bytes()
    secret_file.rename(tmp_path / "token-secret.before-rollback")
    started = time.monotonic()
    initialized = _restore(previous, own_store.owner, backup)
    figures["restore_s"] = _seconds(started)
    assert f"token secret {secret_file}: created (mode 0600)" in initialized, initialized
    assert secret_file.read_bytes() != old_secret
    started = time.monotonic()
    for user in deleted:
        previous.command("player", "delete", user)
    figures["delete_again_s"] = _seconds(started)
    assert _counts(own_store.owner) == (1, 3)
    assert not _holds(own_store, PLAYERS[3].encode(), tmp_path), (
        f"{PLAYERS[3]!r} is still in the store"
    )
    assert _holds(own_store, PLAYERS[4].encode(), tmp_path)  # what the search would find
    started = time.monotonic()
    old_proc, old_port, _ = previous.serve(own_store.web)
    figures["old_start_s"] = _seconds(started)
    try:
        assert get_text(old_port, "/readyz") == (200, '{"success":true,"status":"ready"}')
        assert _openapi_version(old_port) == "1"
        # Every token minted before the roll back is refused, whatever the backup says of its
        # player: those of players revoked (1), disabled (2: one minted before the backup, one
        # after), deleted (3) and added (5) since the backup, and that of player 4, untouched.
        pre_rollback = [*tokens.items(), (2, since_backup)]
        answers = [_answer(old_port, api_key, user, token) for user, token in pre_rollback]
        figures["old_tokens_authenticated"] = (
            f"{sum(a != REFUSED for a in answers)} of {len(answers)}"
        )
        assert answers == [REFUSED] * len(pre_rollback), json.dumps(figures)
        # A token 0.1.0 mints now authenticates; the deleted player has none.
        fresh = previous.json("token", "issue", "--game", str(game_id), "--user", "4")[
            "game_auth_token"
        ]
        assert _answer(old_port, api_key, 4, fresh) == _ok(4)
        gone = previous.command("player", "show", "3", ok=False)
        assert (gone.returncode, gone.stderr) == (1, "authsvc: error: no player 3\n")
        assert previous.json("audit", "verify")["intact"] is True
    finally:
        stop(old_proc)
    print("figures:", json.dumps(figures))
