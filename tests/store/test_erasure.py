"""Deleting a player, with erasure you can prove (docs/admin-api.md, "Deleting a player";
docs/admin.md, "Erasure"), on both engines, through the admin API and the command.

Afterwards the player is 404; every earlier token is refused (the game-facing app, staleness 0);
the same id signed up again, by any path (PUT, the batch, `player add`, `player import`, `authsvc
import`), starts past the deleted player's epoch, so no old token ever authenticates again. The
player's usernames are gone: from the SQLite store's files (the main file and the -wal, read as
bytes, within 10 s of the answer, while a game-facing gunicorn with the default staleness reads the
store), from every table's live rows (both engines), from every audit record `GET /v1/audit` and
`authsvc audit` return, from an export and a backup; and `authsvc audit verify` still passes on the
whole chain, records written the way the release before wrote them (names in clear) included.
"""

from __future__ import annotations

import datetime
import http.client
import json
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from authsvc.operations import players as players_ops
from authsvc.operations import webhooks
from authsvc.operations.context import Context
from authsvc.store import audit as trail
from authsvc.tokens import mint_token
from tests import factories
from tests.support import (
    PATH,
    free_port,
    init_as_owner,
    problem,
    start_gunicorn,
    store_sql,
    wait_for_port,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "postgres"
CTX = Context(actor="cli:test")


def actions(store_url: str, user_id: int) -> list[str]:
    return [
        row[0]
        for row in store_sql(
            store_url, "SELECT action FROM audit WHERE user_id = ? ORDER BY id", (user_id,)
        )
    ]


# -- the API and the command ----------------------------------------------------------------------


def test_delete_answers_deleted_and_effective_by_then_the_player_is_404(
    admin, world, settings, store_url
):
    app, headers = admin.app, admin.headers("web-tier")
    assert app.put_json("/v1/players/77", {"username": "zed"}, headers=headers).status_int == 201
    before = time.time()
    r = app.delete("/v1/players/77", headers=headers)
    assert r.status_int == 200 and r.headers["Content-Type"] == "application/json"
    assert set(r.json) == {"user_id", "deleted", "effective_by"}
    assert (r.json["user_id"], r.json["deleted"]) == (77, True)
    effective_by = datetime.datetime.fromisoformat(r.json["effective_by"]).timestamp()
    assert (
        before + settings.max_staleness
        <= effective_by
        <= time.time() + settings.max_staleness + 0.001
    )
    problem(app.get("/v1/players/77", headers=headers, expect_errors=True), 404, "not-found")
    problem(app.delete("/v1/players/77", headers=headers, expect_errors=True), 404, "not-found")
    problem(app.delete("/v1/players/999", headers=headers, expect_errors=True), 404, "not-found")
    assert actions(store_url, 77) == ["player.add", "player.delete"]
    assert world.store.get_player(77) is None


def test_delete_honours_if_match_and_an_idempotency_key(admin, world, store_url):
    app, headers = admin.app, admin.headers("web-tier")
    stale = app.get("/v1/players/4242", headers=headers).headers["ETag"]
    app.post("/v1/players/4242/revoke", headers=headers)
    body = problem(
        app.delete("/v1/players/4242", headers=headers | {"If-Match": stale}, expect_errors=True),
        412,
        "precondition-failed",
    )
    assert "4242" in body["detail"] and world.store.get_player(4242) is not None
    current = app.get("/v1/players/4242", headers=headers).headers["ETag"]
    keyed = headers | {"If-Match": current, "Idempotency-Key": "delete-4242"}
    first = app.delete("/v1/players/4242", headers=keyed)
    again = app.delete("/v1/players/4242", headers=keyed)
    assert first.status_int == again.status_int == 200
    assert again.json == first.json and again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert actions(store_url, 4242).count("player.delete") == 1
    # If-Match on a player that does not exist: 404, as without it (RFC 9110 13.2.1)
    problem(
        app.delete("/v1/players/4242", headers=headers | {"If-Match": current}, expect_errors=True),
        404,
        "not-found",
    )


def test_the_command_deletes_a_player_and_says_so(command_as_alice, store_url):
    run = command_as_alice
    assert run("init")[0] == 0
    assert run("player", "add", "42", "carol")[0] == 0
    assert run("player", "add", "43", "dave")[0] == 0
    code, out, err = run("player", "delete", "42", "--json")
    assert code == 0, err
    assert json.loads(out) == {"user_id": 42, "deleted": True}
    code, out, err = run("player", "delete", "43")
    assert code == 0 and out.startswith("player 43 deleted")
    for argv in (["player", "show", "42"], ["player", "delete", "42"], ["player", "revoke", "43"]):
        code, out, err = run(*argv)
        assert code == 1 and err.startswith("authsvc: error: no player 4")
    assert actions(store_url, 42)[-1] == "player.delete"
    assert run("audit", "verify")[0] == 0


# -- tokens: refused from effective_by on, never revived
# --------------------------------------------


def test_old_tokens_are_refused_and_a_recreated_id_never_revives_one(
    admin, world, app, store_url, settings
):
    """Each way an id comes back (PUT, batch, `player add`, `player import`) starts past the epoch
    the deleted player had: every token ever minted for the id before stays refused; a new one
    works."""
    api, headers = admin.app, admin.headers("web-tier")

    def authenticates(token: str) -> bool:
        params = {"user_id": "4242", "game_auth_token": token, "api_key": world.api_key}
        return app.get(PATH, params).json["success"]

    tokens = []
    for _ in range(2):
        tokens.append(world.token())
        players_ops.revoke_player(world.store, CTX, world.user_id)
    tokens.append(world.token())
    assert authenticates(tokens[-1]) and not authenticates(tokens[0])
    epoch = world.store.get_player(world.user_id).epoch
    recreate = {
        "PUT": lambda: api.put_json("/v1/players/4242", {"username": "alice"}, headers=headers),
        "batch": lambda: api.post_json(
            "/v1/players/batch",
            {"players": [{"user_id": 4242, "username": "alice"}]},
            headers=headers,
        ),
        "player add": lambda: players_ops.add_player(world.store, CTX, 4242, "alice"),
        "player import": lambda: players_ops.import_players(world.store, CTX, b"4242,alice\n"),
    }
    for how, call in recreate.items():
        assert api.delete("/v1/players/4242", headers=headers).status_int == 200
        assert not any(authenticates(t) for t in tokens), how  # staleness 0: refused at once
        call()
        player = world.store.get_player(4242)
        assert player.epoch > epoch, how
        assert not any(authenticates(t) for t in tokens), how
        for old in range(epoch + 1):  # whatever epoch a token of the old player was minted for
            assert not authenticates(
                mint_token(settings.token_secrets[0], world.game_id, 4242, old)
            ), (how, old)
        tokens.append(world.token())
        assert authenticates(tokens[-1]), how
        epoch = player.epoch
    assert (
        players_ops.add_player(world.store, CTX, 5, "e").epoch == 0
    )  # an id never deleted starts at 0


# -- erasure you can prove -------------------------------------------------------------------------

GONE = [
    "zelda-legacy",
    "zelda-one",
    "zelda-two",
    "z\u00e9lda-three",
]  # the deleted player's names, ever
KEPT = "kept-player-name"


def forms(name: str) -> list[bytes]:
    """The bytes a name can be stored as: UTF-8, and as canonical JSON writes it (non-ASCII
    escaped)."""
    return [name.encode("utf-8"), json.dumps(name)[1:-1].encode("ascii")]


def legacy_record(store, user_id: int, before: dict, after: dict) -> None:
    """A record as the release before wrote it: the names in clear inside the hashed changes."""
    with store.write(trail.Audit("cli:old-release", None)) as tx:
        tx.record("player.rename", user_id=user_id, before=before, after=after)


def hammer(port: int, params: dict, stop: threading.Event, seen: list) -> None:
    """Authenticate as fast as one client can (every worker keeps a read snapshot) until told to
    stop."""
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", PATH + "?" + urllib.parse.urlencode(params))
        seen.append(json.loads(conn.getresponse().read())["success"])
        conn.close()


def live_rows(store_url: str) -> str:
    """Every live row of every table of the store, as text."""
    if store_url.startswith("sqlite://"):
        tables = [
            r[0]
            for r in store_sql(store_url, "SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
    else:
        tables = [
            r[0]
            for r in store_sql(
                store_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            )
        ]
    return "\n".join(repr(store_sql(store_url, f"SELECT * FROM {table}")) for table in tables)


def test_a_deleted_players_names_leave_the_store_the_trail_the_export_and_the_backup(
    admin, world, env, store_url, command_as_alice, tmp_path
):
    api, headers = admin.app, admin.headers("web-tier")
    run = command_as_alice
    state = {"enabled": True, "epoch": 0}
    webhooks.add_webhook(
        world.store,
        CTX,
        "https://game.example.com/h",
        ["player.created", "player.renamed"],
        None,
        "",
    )
    players_ops.add_player(world.store, CTX, 42, "zelda-one")
    players_ops.add_player(world.store, CTX, 43, KEPT)
    legacy_record(
        world.store, 42, state | {"username": "zelda-legacy"}, state | {"username": "zelda-one"}
    )
    legacy_record(world.store, 43, state | {"username": "kept-legacy"}, state | {"username": KEPT})
    for name in GONE[2:]:
        assert api.put_json("/v1/players/42", {"username": name}, headers=headers).status_int == 200
    api.post("/v1/players/42/revoke", headers=headers)
    api.post_json("/v1/tokens", {"game_id": world.game_id, "user_id": 42}, headers=headers)
    api.post_json(
        "/v1/players/batch",
        {
            "players": [
                {"user_id": 42, "username": "zelda-one"},
                {"user_id": 44, "username": "another"},
            ]
        },
        headers=headers,
    )
    api.put_json("/v1/players/42", {"username": GONE[-1]}, headers=headers)
    rows = live_rows(store_url)
    for name in GONE + [KEPT]:  # each name is in the store before the delete
        assert any(form.decode() in rows for form in forms(name)), name
    events = repr(
        store_sql(store_url, "SELECT data FROM events")
    )  # the events outbox holds them too
    for name in GONE[1:]:
        assert any(form.decode() in events for form in forms(name)), name
    readers = None
    if store_url.startswith("sqlite://"):
        # A game-facing gunicorn with the default staleness (1 s) keeps reading: the checkpoint that
        # empties the -wal file must wait for its snapshots, and still make the bound.
        port = free_port()
        log = open(tmp_path / "web.log", "w")  # noqa: SIM115 - closed with the process below
        readers = start_gunicorn(
            env | {"AUTHSVC_MAX_STALENESS": "1"}, port=port, workers=2, stdout=log, stderr=log
        )
        wait_for_port(port)
        stop, seen = threading.Event(), []
        token = mint_token(world.settings.token_secrets[0], world.game_id, 42, 1)
        thread = threading.Thread(
            target=hammer,
            args=(
                port,
                {"user_id": "42", "game_auth_token": token, "api_key": world.api_key},
                stop,
                seen,
            ),
        )
        thread.start()
        # The first answer, before the delete: a busy machine may take seconds to boot the workers.
        started = time.monotonic()
        while not seen and thread.is_alive() and time.monotonic() - started < 60:
            time.sleep(0.05)
        time.sleep(1)
    try:
        answer = api.delete("/v1/players/42", headers=headers)
        answered = time.monotonic()
        assert answer.status_int == 200
        if store_url.startswith("sqlite://"):
            path = store_url.removeprefix("sqlite://")
            while True:  # within 10 s of the answer, no file of the store holds any of the names
                files = {
                    suffix: Path(path + suffix).read_bytes()
                    for suffix in ("", "-wal", "-shm")
                    if Path(path + suffix).exists()
                }
                found = [
                    (name, suffix)
                    for name in GONE
                    for form in forms(name)
                    for suffix, data in files.items()
                    if form in data
                ]
                if not found or time.monotonic() - answered > 10:
                    break
                time.sleep(0.2)
            assert found == [], found
            assert KEPT.encode() in files[""] + files.get(
                "-wal", b""
            )  # the search finds what is there
    finally:
        if readers is not None:
            stop.set()
            thread.join()
            readers.terminate()
            readers.wait(timeout=20)
            log.close()
            assert seen and seen[0] is True and seen[-1] is False  # it authenticated, then did not
    rows = live_rows(store_url)
    for name in GONE:
        assert not any(form.decode() in rows for form in forms(name)), name
    assert KEPT in rows
    # No audit answer names the player any more; the other player's names are there.
    page = api.get("/v1/audit", {"limit": "1000"}, headers=headers).text
    listed = run("audit", "--limit", "1000")[1] + run("audit", "--limit", "1000", "--json")[1]
    for text in (page, listed):
        assert KEPT in text and "kept-legacy" in text
        assert not any(form.decode() in text for name in GONE for form in forms(name)), text
    records = api.get("/v1/audit", {"player": "42", "limit": "1000"}, headers=headers).json[
        "records"
    ]
    assert records[0]["action"] == "player.delete"
    renames = [r for r in records if r["action"] == "player.rename"]
    assert len(renames) == 4 and all(
        r["changes"]["after"]["username"] == {"erased": True} for r in renames
    )
    kept = api.get("/v1/audit", {"player": "43", "limit": "1000"}, headers=headers).json["records"]
    assert [r["changes"]["after"]["username"] for r in kept] == [KEPT, KEPT]
    code, out, err = run("audit", "verify")
    assert code == 0 and "chain intact" in out, out + err
    # An export and a backup hold no name of the player either.
    export = tmp_path / "export.jsonl"
    assert run("export", str(export))[0] == 0
    copies = [export.read_bytes()]
    if store_url.startswith("sqlite://"):
        assert run("backup", str(tmp_path / "copy.db"))[0] == 0
        copies.append((tmp_path / "copy.db").read_bytes())
    for data in copies:
        assert KEPT.encode() in data
        assert not any(form in data for name in GONE for form in forms(name))


# -- the chain: what verify proves --------------------------------------------------------------


def test_verify_names_a_kept_name_changed_or_dropped_by_hand_and_an_erased_record_altered(
    command_as_alice, store_url
):
    run = command_as_alice
    assert run("init")[0] == 0
    assert run("player", "add", "42", "carol")[0] == 0
    assert run("player", "rename", "42", "erin")[0] == 0  # record 2
    assert run("audit", "verify")[0] == 0
    (names,) = store_sql(store_url, "SELECT names FROM audit_names WHERE record_id = 2")[0]
    assert (
        "erin" in names
        and "erin" not in store_sql(store_url, "SELECT changes FROM audit WHERE id = 2")[0][0]
    )
    store_sql(
        store_url,
        "UPDATE audit_names SET names = ? WHERE record_id = 2",
        (names.replace("erin", "mallory"),),
    )
    code, out, _ = run("audit", "verify")
    assert code == 1 and "record 2" in out and "username" in out
    store_sql(store_url, "DELETE FROM audit_names WHERE record_id = 2")
    code, out, _ = run("audit", "verify")
    assert code == 1 and "record 2" in out and "player 42 was not deleted" in out
    store_sql(
        store_url, "INSERT INTO audit_names (record_id, user_id, names) VALUES (2, 42, ?)", (names,)
    )
    assert run("audit", "verify")[0] == 0
    # An erased record of the release before: its new content is vouched for by the delete record.
    from authsvc.operations.context import admin_store
    from authsvc.settings import Settings

    with admin_store(Settings.from_env()) as store:
        legacy_record(
            store, 42, {"username": "erin", "epoch": 0}, {"username": "frank", "epoch": 0}
        )  # record 3
    (original,) = store_sql(store_url, "SELECT changes FROM audit WHERE id = 3")[0]
    assert run("player", "delete", "42")[0] == 0
    assert run("audit", "verify")[0] == 0
    (changes,) = store_sql(store_url, "SELECT changes FROM audit WHERE id = 3")[0]
    assert "erin" not in changes and "frank" not in changes
    store_sql(
        store_url,
        "UPDATE audit SET changes = ? WHERE id = 3",
        (changes.replace('"epoch":0', '"epoch":7'),),
    )
    code, out, _ = run("audit", "verify")
    assert code == 1 and "record 3 was altered" in out
    # The names put back (a record restored from an older copy): its hash matches again, and verify
    # says so.
    store_sql(store_url, "UPDATE audit SET changes = ?, erased_by = NULL WHERE id = 3", (original,))
    code, out, _ = run("audit", "verify")
    assert (
        code == 1 and "record 3 was altered: it holds again what the deletion of player 42" in out
    )


# -- the upgrade
# ------------------------------------------------------------------------------------


def test_the_schema_step_keeps_the_trail_as_it_was_and_a_deletion_then_erases_its_clear_names(
    store_url, request, tmp_path, settings, monkeypatch
):
    """The last migration (SQLite 4 -> 5, PostgreSQL 5 -> 6) on a store the release before made and
    filled: the records it wrote (names in clear) stay byte for byte and verify; a player deleted
    afterwards has its names erased from them, the other player's stay, and the chain still
    verifies."""
    import importlib

    from authsvc.cli.audit_cmd import verify
    from authsvc.errors import ConfigError
    from authsvc.store import open_store

    sqlite = store_url.startswith("sqlite://")
    url = (
        "sqlite://" + str(tmp_path / "old.db")
        if sqlite
        else request.getfixturevalue("pg_databases").create(migrate=False)
    )
    engine = importlib.import_module(
        "authsvc.store.sqlite.store" if sqlite else "authsvc.store.postgres.store"
    )
    current = engine.MIGRATIONS
    monkeypatch.setattr(engine, "MIGRATIONS", current[:-1])  # the release before's migrate()
    store = open_store(url, readonly=False, settings=settings)
    try:
        store.migrate()
        store_sql(
            url,
            "INSERT INTO players (user_id, username, epoch) VALUES (42, 'zelda-one', 1), (43, ?, "
            "0)",
            (KEPT,),
        )
        state = {"enabled": True, "epoch": 0}
        for user_id, old, new in ((42, "zelda-legacy", "zelda-one"), (43, "kept-legacy", KEPT)):
            legacy_record(store, user_id, state | {"username": old}, state | {"username": new})
        with store.write(trail.Audit("cli:old-release", None)) as tx:
            tx.record(
                "player.revoke",
                user_id=42,
                before=state | {"username": "zelda-one"},
                after=state | {"username": "zelda-one", "epoch": 1},
            )
        written = store_sql(url, "SELECT id, changes, hash FROM audit ORDER BY id")
        with pytest.raises(ConfigError, match="this release needs"):
            store.check()
        monkeypatch.setattr(engine, "MIGRATIONS", current)
        assert store.migrate() == (len(current) - 1, len(current))
        store.check()
        assert store_sql(url, "SELECT id, changes, hash FROM audit ORDER BY id") == written
        assert verify(store.audit_walk()).problem is None
        assert factories.delete_player(store, 42, audit=trail.Audit("cli:test", None)) == 1
        verdict = verify(store.audit_walk())
        assert verdict.problem is None and verdict.records == 4
        rows = live_rows(url)
        assert "zelda" not in rows and KEPT in rows and "kept-legacy" in rows
        (delete,) = store.audit_records(action="player.delete")
        assert json.loads(delete.changes)["after"]["records_erased"].keys() == {"1", "3"}
        assert factories.add_player(store, 42, "zelda-one-again").epoch == 2
    finally:
        store.close()


# -- moving a store
# ---------------------------------------------------------------------------------


def test_an_export_carries_the_deleted_ids_without_a_name_and_the_import_keeps_them(
    command_as_alice, store_url, tmp_path, monkeypatch
):
    run = command_as_alice
    assert run("init")[0] == 0
    assert run("player", "add", "42", "zelda-one")[0] == 0
    assert run("player", "revoke", "42")[0] == 0
    assert run("player", "delete", "42")[0] == 0
    export = tmp_path / "export.jsonl"
    assert run("export", str(export))[0] == 0
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert {"type": "deleted_player", "user_id": 42, "epoch": 1} in lines
    assert b"zelda" not in export.read_bytes()
    moved = "sqlite://" + str(tmp_path / "moved.db")
    monkeypatch.setenv("AUTHSVC_STORE", moved)
    assert run("init")[0] == 0
    assert run("import", str(export))[0] == 0
    code, out, _ = run("player", "add", "42", "someone-else", "--json")
    assert code == 0 and json.loads(out)["epoch"] == 2


# -- PostgreSQL: the admin role erases through the function it may call ----------------------------


def test_the_admin_role_deletes_and_erases_but_still_cannot_rewrite_a_record(
    own_pg, secret_file, monkeypatch, capsys
):
    import psycopg

    from authsvc.cli import command as cli
    from authsvc.store.postgres.store import PostgresStore

    monkeypatch.setenv("SUDO_USER", "alice")
    url = init_as_owner(own_pg, secret_file, monkeypatch)
    for argv in (
        ["player", "add", "5", "zelda-one"],
        ["player", "rename", "5", "zelda-two"],
        ["player", "add", "6", "x"],
    ):
        assert cli.main(argv) == 0, capsys.readouterr().err
    store = PostgresStore(url("authsvc_admin"), readonly=False)
    try:
        legacy_record(store, 5, {"username": "zelda-legacy"}, {"username": "zelda-two"})
        legacy_record(store, 6, {"username": "y"}, {"username": "x"})
    finally:
        store.close()
    capsys.readouterr()
    assert cli.main(["player", "delete", "5"]) == 0, capsys.readouterr().err
    assert cli.main(["audit", "verify"]) == 0, capsys.readouterr().out
    assert "zelda" not in live_rows(url("authsvc_owner"))
    with psycopg.connect(url("authsvc_admin"), autocommit=True) as conn:
        (record_id,) = conn.execute(
            "SELECT id FROM audit WHERE user_id = 6 AND actor = 'cli:old-release'"
        ).fetchone()
        for statement in ("UPDATE audit SET changes = '{}'", "UPDATE audit SET actor = 'x'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        # The function erases names from a record of a deleted player only, and nothing else.
        (delete_id,) = conn.execute(
            "SELECT id FROM audit WHERE action = 'player.delete'"
        ).fetchone()
        with pytest.raises(psycopg.errors.RaiseException):
            conn.execute(
                "SELECT authsvc_erase_names(%s, %s, %s)",
                (record_id, '{"after":{},"before":{}}', delete_id),
            )


def test_no_role_reads_a_deleted_name_in_postgresqls_statistics(
    own_pg, secret_file, monkeypatch, capsys
):
    """docs/stores.md, "Erasure": the planner's statistics (pg_stats, which each role reads for the
    columns it may SELECT) hold no value of a column that names a person, so after a deletion and
    the documented VACUUMs neither the web role nor the admin role finds the name there, however
    ANALYZE (autovacuum's) ran before."""
    import psycopg

    from authsvc.cli import command as cli
    from authsvc.store.postgres.store import PostgresStore

    url = init_as_owner(own_pg, secret_file, monkeypatch)
    store = PostgresStore(url("authsvc_admin"), readonly=False)
    try:
        for n in range(1, 61):
            factories.add_player(store, n, f"stats-player-{n:03d}")
        factories.rename_player(store, 5, "zelda-in-stats")
    finally:
        store.close()
    stats = (
        "SELECT tablename, attname, coalesce(most_common_vals::text, '') || "
        "coalesce(histogram_bounds::text, '') FROM pg_stats"
    )
    with psycopg.connect(url("authsvc_owner"), autocommit=True) as owner:
        owner.execute("ANALYZE")  # as autovacuum's analyze would, at any time before the deletion
    assert cli.main(["player", "delete", "5"]) == 0, capsys.readouterr().err
    with psycopg.connect(
        url("authsvc_owner"), autocommit=True
    ) as owner:  # docs/stores.md, "Erasure", as the owner
        owner.execute("VACUUM (FULL, VERBOSE) audit, audit_names, player_keys, deleted_players")
        owner.execute("VACUUM (FULL, VERBOSE) players")
        seen = owner.execute(stats).fetchall()
    assert ("players", "user_id") in {(t, a) for t, a, _ in seen}  # the statistics are there
    for role in ("authsvc_web", "authsvc_admin", "authsvc_owner"):
        with psycopg.connect(url(role), autocommit=True) as conn:
            found = [
                (t, a)
                for t, a, values in conn.execute(stats).fetchall()
                if "zelda-in-stats" in values or "stats-player-005" in values
            ]
        assert found == [], (role, found)
