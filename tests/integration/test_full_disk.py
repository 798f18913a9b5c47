"""A full disk under a SQLite store (docs/operations.md, "Post-install check"): a real tmpfs filled
to the last block. The admin API's 503 says the disk is full (not "try again"), nothing is written,
and `authsvc check` against the running service fails with that reason. The game-facing service
keeps answering: it only reads.

PostgreSQL's disk is its server's, which no client sees: the same 503 comes from its disk_full error
(store/postgres/store.py), and `authsvc check` does not look there.
"""

from __future__ import annotations

import errno
import json
import subprocess

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.cli.command import main
from authsvc.settings import Settings
from authsvc.store import open_store
from harness.processes import stop
from tests.support import ALL_SCOPES, free_port, serve_gunicorn, skip_or_fail

pytestmark = pytest.mark.engine("sqlite")


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs (mounting needs root, as in the CI container), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs (root needed): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(directory) -> None:
    """Write a file in ``directory`` until the disk refuses another byte."""
    with open(directory / "filler", "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e


def test_a_full_disk_fails_check_and_the_admin_api_says_so(
    small_disk, secret_file, tmp_path, monkeypatch, capsys
):
    store_url = f"sqlite://{small_disk / 'authsvc.db'}"
    env = {
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)
    assert main(["init"]) == 0
    assert main(["game", "add", "Chess", "--json"]) == 0
    api_key = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["api_key"]
    assert main(["player", "add", "42", "alice"]) == 0
    key_file = tmp_path / "key.txt"
    key_file.write_text(api_key + "\n")
    settings = Settings.from_env(env)
    admin_store = open_store(store_url, readonly=False, settings=settings)
    assert (
        main(
            ["api-token", "add", "web", "--json", *(a for s in ALL_SCOPES for a in ("--scope", s))]
        )
        == 0
    )
    api_token = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token"]
    admin = webtest.TestApp(AdminApp(settings, admin_store), lint=True)
    headers = {"Authorization": f"Bearer {api_token}"}
    port = free_port()
    proc = serve_gunicorn(env, port=port, log_path=tmp_path / "gunicorn.log", workers=1)
    argv = [
        "check",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--game-id",
        "1",
        "--user-id",
        "42",
        "--api-key-file",
        str(key_file),
    ]
    try:
        assert main(argv) == 0, capsys.readouterr()
        assert "all 4 checks passed" in capsys.readouterr().out
        assert (
            admin.put_json("/v1/players/7", {"username": "dora"}, headers=headers).status_int == 201
        )

        fill(small_disk)
        r = admin.put_json(
            "/v1/players/8", {"username": "erin"}, headers=headers, expect_errors=True
        )
        assert r.status_int == 503 and r.json["type"] == "urn:authsvc:problem:unavailable", r.text
        assert r.json["detail"] == "the store's disk is full; nothing was written", r.json
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert (
            "FAIL" in out
            and "disk" in out
            and "0 KiB free" in out
            and "1 of 5 checks FAILED" in out
        ), out
        # The service answered all along: its four checks still pass.
        assert out.count("ok  ") == 4, out
    finally:
        stop(proc)
        admin.app.store.close()
    (small_disk / "filler").unlink()
    assert main(["player", "show", "8"]) == 1  # the refused write wrote nothing
