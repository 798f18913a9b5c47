"""The shipped systemd units: `systemd-analyze verify` clean, `security` rating at most 2.0 for each
service.

The units are rendered with APP_DIR pointing at a directory whose venv/ is this
test's virtualenv, so the ExecStart= binary exists, as verify requires.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
MAX_EXPOSURE = 2.0


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    if shutil.which("systemd-analyze") is None:
        skip_or_fail("systemd-analyze is not installed (Debian: apt-get install systemd)")
    root = tmp_path_factory.mktemp("systemd")
    app = root / "app"
    app.mkdir()
    (app / "venv").symlink_to(Path(sys.prefix))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "authsvc.deployment",
            str(REPO / "deploy"),
            str(root / "r"),
            "--set",
            "API_HOST=api.example.com",
            "--set",
            "LEGACY_HOST=legacy.example.com",
            "--set",
            f"APP_DIR={app}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return root / "r" / "systemd"


def _analyze(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


UNITS = (
    "./authsvc.socket",
    "./authsvc.service",
    "./authsvc-heartbeat.service",
    "./authsvc-admin.socket",
    "./authsvc-admin.service",
    "./authsvc-deliver.service",
)
SERVICES = (
    "authsvc.service",
    "authsvc-heartbeat.service",
    "authsvc-admin.service",
    "authsvc-deliver.service",
)


def test_verify_is_clean(units):
    done = _analyze("verify", *UNITS, cwd=units)
    # Unknown keys and other mistakes are warnings with exit 0: any output is a failure.
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_verify_would_catch_a_missing_binary(units, tmp_path):
    # The check above can fail: the same unit with an ExecStart that does not exist.
    for name in UNITS:
        text = (units / name).read_text()
        (tmp_path / name).write_text(
            re.sub(r"ExecStart=\S+", "ExecStart=/nonexistent/gunicorn", text)
        )
    done = _analyze("verify", *UNITS, cwd=tmp_path)
    assert done.returncode != 0 and "/nonexistent/gunicorn" in done.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_security_exposure_at_most_2(units, service):
    done = _analyze("security", "--offline=true", "--no-pager", f"./{service}", cwd=units)
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        skip_or_fail("this systemd-analyze has no --offline (systemd 250 or later needed)")
    match = re.search(rf"Overall exposure level for {re.escape(service)}: (\d+\.\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, done.stdout


def test_units_keep_their_promises(units):
    service = (units / "authsvc.service").read_text()
    socket_unit = (units / "authsvc.socket").read_text()
    for line in (
        "Type=notify",
        "User=authsvc",
        "StateDirectory=authsvc",
        # re-read after a rotation: no copy
        "Environment=AUTHSVC_TOKEN_SECRET_FILE=/etc/authsvc/token-secret",
        "ExecReload=/bin/kill -s HUP $MAINPID",
        "Requires=authsvc.socket",
    ):
        assert re.search(rf"^{re.escape(line)}$", service, re.M), line
    assert "DynamicUser" not in service  # the admin command shares the store as the same user
    assert (
        "LoadCredential" not in service
    )  # a copy made at start would need a restart after a rotation
    for line in ("ListenStream=/run/authsvc.sock", "SocketGroup=www-data", "SocketMode=0660"):
        assert re.search(rf"^{re.escape(line)}$", socket_unit, re.M), line


def test_the_heartbeat_unit_runs_the_admin_command_for_ever(units):
    heartbeat = (units / "authsvc-heartbeat.service").read_text()
    for line in (
        "User=authsvc",
        "Environment=AUTHSVC_CONFIG=/etc/authsvc/heartbeat.toml",  # its own role, not the owner's
        "Restart=always",
        "StartLimitIntervalSec=0",
        "IPAddressDeny=any",
    ):
        assert re.search(rf"^{re.escape(line)}$", heartbeat, re.M), line
    assert re.search(r"^ExecStart=\S+/venv/bin/authsvc heartbeat$", heartbeat, re.M)


def test_the_deliver_unit_runs_the_deliverer_for_ever_with_the_admin_settings(units):
    deliver = (units / "authsvc-deliver.service").read_text()
    for line in (
        "User=authsvc",
        # it writes the deliveries' bookkeeping
        "Environment=AUTHSVC_CONFIG=/etc/authsvc/admin.toml",
        "StateDirectory=authsvc",
        "Restart=always",
        "StartLimitIntervalSec=0",
    ):
        assert re.search(rf"^{re.escape(line)}$", deliver, re.M), line
    assert re.search(r"^ExecStart=\S+/venv/bin/authsvc deliver$", deliver, re.M)
    assert (
        "LoadCredential" not in deliver and "IPAddressDeny" not in deliver
    )  # no token secret; receivers anywhere


def test_the_admin_api_unit_runs_the_admin_app_on_a_group_restricted_socket(units):
    service = (units / "authsvc-admin.service").read_text()
    socket_unit = (units / "authsvc-admin.socket").read_text()
    for line in (
        "Type=notify",
        "User=authsvc",
        "Requires=authsvc-admin.socket",
        "Environment=AUTHSVC_CONFIG=/etc/authsvc/admin.toml",
        # re-read after a rotation: no copy
        "Environment=AUTHSVC_TOKEN_SECRET_FILE=/etc/authsvc/token-secret",
        "StateDirectory=authsvc",
    ):
        assert re.search(rf"^{re.escape(line)}$", service, re.M), line
    assert re.search(
        r"^ExecStart=\S+/venv/bin/gunicorn --config \S+/gunicorn.conf.py "
        r"authsvc.api.wsgi:create_app\(\)$",
        service,
        re.M,
    )
    for line in (
        "ListenStream=/run/authsvc-admin.sock",
        "SocketGroup=authsvc-admin",
        "SocketMode=0660",
    ):
        assert re.search(rf"^{re.escape(line)}$", socket_unit, re.M), line


def _settings(unit: str) -> dict[str, str]:
    """The unit's Key=value lines (the last one of a key wins, as in systemd)."""
    return dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))


def test_the_admin_api_yields_the_cpu_and_the_disk_to_authentication(units):
    """docs/operations.md (section 19): the admin service runs at low priority, so a sync through
    it takes what authentication leaves; the game-facing service keeps the defaults."""
    admin = _settings((units / "authsvc-admin.service").read_text())
    web = _settings((units / "authsvc.service").read_text())
    assert 10 <= int(admin.get("Nice", "0")) <= 19
    assert int(admin.get("CPUWeight", "100")) <= 20
    assert (
        admin.get("IOSchedulingClass") == "best-effort" and admin.get("IOSchedulingPriority") == "7"
    )
    # Authentication keeps the defaults: no lower priority, no heavier weight than the admin's.
    assert int(web.get("Nice", "0")) == 0 and int(web.get("CPUWeight", "100")) >= 100
    assert "IOSchedulingClass" not in web


def test_verify_would_catch_a_priority_systemd_cannot_apply(units, tmp_path):
    # test_verify_is_clean also proves the admin unit's Nice=, CPUWeight= and IOScheduling*= valid:
    # the same unit with values out of range is not clean.
    text = (units / "authsvc-admin.service").read_text()
    for key, bad in (("Nice", "20"), ("CPUWeight", "0"), ("IOSchedulingPriority", "8")):
        broken = re.sub(rf"^{key}=.*$", f"{key}={bad}", text, flags=re.M)
        assert broken != text, key
        for name in ("authsvc-admin.socket", "authsvc-admin.service"):
            (tmp_path / name).write_text(
                broken if name.endswith(".service") else (units / name).read_text()
            )
        done = _analyze("verify", "./authsvc-admin.socket", "./authsvc-admin.service", cwd=tmp_path)
        line = broken[: broken.index(f"\n{key}={bad}\n")].count("\n") + 2
        assert f"authsvc-admin.service:{line}:" in done.stderr, (
            key,
            done.stderr,
        )  # names the bad line
