"""A real gunicorn started the way the service unit starts it (deploy/gunicorn.conf.py and a settings file).

A wrong setting stops it at once with one line on stderr and a non-zero exit;
the documented layout (top-level settings and a [gunicorn] table) serves.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import free_port, start_gunicorn, wait_for_port

REPO = Path(__file__).resolve().parent.parent
CONF = str(REPO / "deploy" / "gunicorn.conf.py")
pytestmark = pytest.mark.engine("sqlite")
# Generous: a failing start-up measured well under 2 s here. Before the fixes,
# the first two cases never exited at all.
EXIT_WITHIN = 30


def _gunicorn_env(tmp_path, env: dict, settings_text: str, **extra: str) -> dict:
    config = tmp_path / "authsvc.toml"
    config.write_text(settings_text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
    return {**clean, **env, "AUTHSVC_CONFIG": str(config), "AUTHSVC_BIND": f"127.0.0.1:{free_port()}", **extra}


def _start_up_failure(tmp_path, env: dict, settings_text: str, **extra: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gunicorn", "--config", CONF],
                          env=_gunicorn_env(tmp_path, env, settings_text, **extra),
                          capture_output=True, text=True, timeout=EXIT_WITHIN, cwd=tmp_path)
    return done, time.monotonic() - started


@pytest.mark.parametrize(
    "settings_text, extra, words",
    [
        # A typo in [gunicorn]: ignored before, so gunicorn served with the default timeout.
        ('[authsvc]\nerror_status = "200"\n[gunicorn]\ntimout = 5\n', {}, ["[gunicorn] timout", "authsvc.toml"]),
        # No worker at all: before, a master that accepted and never answered.
        ("", {"AUTHSVC_WORKERS": "0"}, ["AUTHSVC_WORKERS must be at least 1"]),
        # The app's own check (make_app in the master): before, a 35-line traceback.
        ("", {"AUTHSVC_STORE": "sqlite:///nonexistent/authsvc.db"}, ["does not exist", "authsvc init"]),
        ("max_body_bytes = true\n", {}, ["max_body_bytes must be an integer", "authsvc.toml"]),
    ],
)
def test_a_bad_setting_stops_gunicorn_with_one_line(tmp_path, env, admin_store, settings_text, extra, words):
    try:
        done, elapsed = _start_up_failure(tmp_path, env, settings_text, **extra)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gunicorn still running after {EXIT_WITHIN} s: the setting was not refused")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("authsvc: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    print(f"exit {done.returncode} after {elapsed:.2f} s: {lines[0]}")


def test_the_documented_layout_serves(tmp_path, env, admin_store):
    """Top-level app settings and a [gunicorn] table: before, the app refused the file ("unknown setting gunicorn")."""
    settings_text = 'error_status = "http"\nmax_body_bytes = 100\n[gunicorn]\nworkers = 1\ntimeout = 10\n'
    gunicorn_env = _gunicorn_env(tmp_path, {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"}, settings_text)
    port = int(gunicorn_env["AUTHSVC_BIND"].rsplit(":", 1)[1])
    proc = start_gunicorn(gunicorn_env, "--graceful-timeout", "5", app="", workers=None, config=CONF,
                          inherit_env=False, cwd=tmp_path)
    try:
        try:
            wait_for_port(port, timeout=30)
        except TimeoutError:
            proc.kill()
            pytest.fail(f"gunicorn did not listen: {proc.communicate(timeout=20)[1]}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b'{"success":true,"status":"ok"}'
        # The file's max_body_bytes (100) reached the app: 101 bytes are a 413 (the default allows 16 KiB).
        conn.request("POST", "/api/authenticate.json", body=b"x" * 101,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        response = conn.getresponse()
        response.read()
        assert response.status == 413
        # Its error_status ("http") too: a missing parameter is a real 400 (the default "200" sends it as HTTP 200).
        conn.request("GET", "/api/authenticate.json")
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())["error"]) == (400, 400)
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=20)
