"""scripts/serve, as a newcomer runs it: the demo starts both apps on loopback (and the deliverer),
and the admin API lines it prints (signup, mint, authenticate, revoke, authenticate again) do
what their comments say when pasted into a shell."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.processes import free_port, stop, wait_for_port
from tests.support import INVALID, skip_or_fail

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _pasted_lines(output: str) -> str:
    """The admin API block as a reader copies it: its command lines, without the comments."""
    block = output.split("paste the lines in order:", 1)[1].split("\nStarting gunicorn", 1)[0]
    return "\n".join(
        line.strip()
        for line in block.splitlines()
        if line.startswith("  ") and not line.strip().startswith("#")
    )


def test_serve_prints_admin_api_lines_that_work(tmp_path):
    if shutil.which("curl") is None:
        skip_or_fail("curl is not installed (Debian: apt-get install curl)")
    port, admin_port = free_port(), free_port()
    out = tmp_path / "serve.out"
    env = {
        **os.environ,
        "PORT": str(port),
        "ADMIN_PORT": str(admin_port),
        "DEMO_DIR": str(tmp_path / "var"),
    }
    with open(out, "wb") as f:
        serve = subprocess.Popen(
            [str(REPO / "scripts/serve")],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "Starting gunicorn" not in out.read_text():
            assert serve.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        wait_for_port(port, timeout=60)
        wait_for_port(admin_port, timeout=60)
        text = out.read_text()
        lines = _pasted_lines(text)
        assert f"http://127.0.0.1:{admin_port}/v1/players/1002" in lines
        done = subprocess.run(
            ["bash", "-e", "-c", lines], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        player, token, first, revoked, again = done.stdout.splitlines()
        signed_up = json.loads(player)
        assert signed_up == {
            "user_id": 1002,
            "username": "new_player",
            "enabled": True,
            "epoch": 0,
            "updated_at": signed_up["updated_at"],
        } and signed_up["updated_at"].endswith("Z")
        assert len(token) == 64
        assert json.loads(first) == {"success": True, "user_id": 1002, "username": "new_player"}
        revoke = json.loads(revoked)
        assert (revoke["user_id"], revoke["epoch"]) == (1002, 1) and revoke["effective_by"]
        # After effective_by the same token is refused (docs/admin-api.md, "The revocation
        # promise").
        assert json.loads(again) == INVALID
        # Both listen on loopback only.
        assert f"Listening at: http://127.0.0.1:{admin_port}" in out.read_text()
        assert f"Listening at: http://127.0.0.1:{port}" in out.read_text()
        # The admin API takes the loopback subscription the script's comment promises (a receiver on
        # this machine, as a developer's is), as the deliverer sends to it.
        env_cmd = {
            **os.environ,
            "AUTHSVC_STORE": f"sqlite://{tmp_path}/var/authsvc.db",
            "AUTHSVC_TOKEN_SECRET_FILE": str(tmp_path / "var" / "token-secret"),
        }
        made = subprocess.run(
            [
                str(REPO / ".venv/bin/authsvc"),
                "api-token",
                "add",
                "hooks",
                "--scope",
                "webhooks:write",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env_cmd,
        )
        assert made.returncode == 0, made.stderr
        hook = subprocess.run(
            [
                "curl",
                "-s",
                "-w",
                "\n%{http_code}",
                "-X",
                "POST",
                f"http://127.0.0.1:{admin_port}/v1/webhooks",
                "-H",
                "Authorization: Bearer " + json.loads(made.stdout)["token"],
                "-H",
                "Content-Type: application/json",
                "-d",
                json.dumps(
                    {"url": f"http://127.0.0.1:{free_port()}/hook", "events": ["player.deleted"]}
                ),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert hook.stdout.rsplit("\n", 1)[1] == "201", hook.stdout
        # And the webhook deliverer beside them (docs/admin.md, "Webhook delivery").
        while "authsvc deliver: delivering the events of sqlite://" not in out.read_text():
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
    finally:
        stop(serve, signal.SIGINT)  # Ctrl-C: the terminal sends it to the script and both gunicorns
