"""Scale: `authsvc player import` loads 1,000,000 players into PostgreSQL, the last of a repeated id
winning (no bound in seconds: one failed on a busy machine, and a speed is for a benchmark, not a
test)."""

from __future__ import annotations

import pytest

from authsvc.cli.command import main
from tests import factories

PLAYERS = 1_000_000


@pytest.mark.slow
def test_player_import_of_a_million_rows_into_postgres(
    pg_databases, tmp_path, secret_file, monkeypatch, capsys
):
    import psycopg

    url = pg_databases.create()
    path = tmp_path / "players.csv"
    with open(path, "w") as f:
        f.write("user_id,username\n")
        f.writelines(f"{i},player{i}\n" for i in range(1, PLAYERS + 1))
        f.write("17,renamed-by-the-last-row\n")  # a repeated id: the last row wins
    monkeypatch.setenv("AUTHSVC_STORE", url)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    assert (
        main(["player", "import", str(path)]) == 0
    )  # its rate is the bench's (BENCHMARKS.md), not a bound here
    assert capsys.readouterr().out.startswith(f"imported {PLAYERS + 1} players")
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT count(*), min(user_id), max(user_id) FROM players"
        ).fetchone() == (
            PLAYERS,
            1,
            PLAYERS,
        )
        assert (
            conn.execute("SELECT username FROM players WHERE user_id = 17").fetchone()[0]
            == "renamed-by-the-last-row"
        )
        assert conn.execute(
            "SELECT username FROM players WHERE user_id = %s", (PLAYERS,)
        ).fetchone()[0] == (f"player{PLAYERS}")


def test_player_import_with_a_bad_row_writes_nothing(
    admin_store, store_url, tmp_path, secret_file, monkeypatch, capsys
):
    factories.add_player(admin_store, 1, "one")
    path = tmp_path / "players.csv"
    path.write_text("".join(f"{i},player{i}\n" for i in range(1, 20_001)) + "0,zero\n")
    monkeypatch.setenv("AUTHSVC_STORE", store_url)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    assert main(["player", "import", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == "authsvc: error: line 20001: user_id must be a whole number from 1 to 2^63-1\n"
    assert admin_store.get_player(1).username == "one" and admin_store.get_player(2) is None
