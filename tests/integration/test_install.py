"""scripts/install --root: a staged install, run twice (it must be idempotent)."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run_install(root: Path, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(REPO / "scripts/install"),
            "--api-host",
            "api.example.com",
            "--legacy-host",
            "legacy.example.com",
            "--set",
            "RATE=50r/s",
            *sets,
            "--root",
            str(root),
            "--python",
            sys.executable,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _install(root: Path, *sets: str) -> subprocess.CompletedProcess:
    done = _run_install(root, *sets)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _admin(root: Path, *args: str) -> str:
    """The staged admin command, pointed at the staged store and secret."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AUTHSVC_CONFIG": str(root / "etc/authsvc/authsvc.toml"),
        "AUTHSVC_STORE": f"sqlite://{root}/var/lib/authsvc/authsvc.db",
        "AUTHSVC_TOKEN_SECRET_FILE": str(root / "etc/authsvc/token-secret"),
    }
    done = subprocess.run(
        [str(root / "opt/authsvc/venv/bin/authsvc"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _body_limits(root: Path) -> tuple[str, str]:
    text = (root / "etc/nginx/snippets/authsvc-limits.conf").read_text()
    limits = dict(re.findall(r"^(client_\w+)\s+([^;]+);", text, re.M))
    return limits["client_max_body_size"], limits["client_body_buffer_size"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    first = _install(root)
    return root, first


def test_staged_install_puts_everything_in_place(staged):
    root, first = staged
    expected = {
        "opt/authsvc/venv/bin/gunicorn": 0o755,
        "opt/authsvc/venv/bin/authsvc": 0o755,
        "opt/authsvc/gunicorn.conf.py": 0o644,
        "opt/authsvc/docs/operations.md": 0o644,
        "opt/authsvc/monitoring/authsvc-rules.yml": 0o644,
        "opt/authsvc/monitoring/grafana-dashboard.json": 0o644,
        "usr/local/bin/authsvc": 0o755,
        "etc/systemd/system/authsvc.socket": 0o644,
        "etc/systemd/system/authsvc.service": 0o644,
        "etc/systemd/system/authsvc-heartbeat.service": 0o644,
        "etc/systemd/system/authsvc-deliver.service": 0o644,
        "etc/systemd/system/authsvc-admin.socket": 0o644,
        "etc/systemd/system/authsvc-admin.service": 0o644,
        "etc/authsvc/admin.toml": 0o640,
        "etc/nginx/sites-available/authsvc.conf": 0o644,
        "etc/nginx/snippets/authsvc-json-errors.conf": 0o644,
        "etc/nginx/snippets/authsvc-tls.conf": 0o644,
        # sticky: the service user replaces its token secret, never root's files
        "etc/authsvc": 0o1770,
        "etc/authsvc/authsvc.toml": 0o640,
        "etc/authsvc/token-secret": 0o600,
        "var/lib/authsvc": 0o750,
    }
    for rel, mode in expected.items():
        assert (root / rel).exists(), rel
        assert _mode(root / rel) == mode, (rel, oct(_mode(root / rel)))
    link = root / "etc/nginx/sites-enabled/authsvc.conf"
    assert os.readlink(link) == "/etc/nginx/sites-available/authsvc.conf"
    # The files name their final paths, not the staging directory.
    site = (root / "etc/nginx/sites-available/authsvc.conf").read_text()
    assert "server_name api.example.com;" in site and 'server_name legacy.example.com "";' in site
    assert str(root) not in site + (root / "etc/systemd/system/authsvc.service").read_text()
    assert "rate=50r/s" in site
    # nginx's body limit is the service's default max_body_bytes until the settings file says
    # otherwise.
    assert _body_limits(root) == ("16384", "16384")
    # Rendered from the installed authsvc.toml (access_record = "edge"): no X-Forwarded-* or
    # X-Request-Id upstream.
    proxy = (root / "etc/nginx/snippets/authsvc-proxy.conf").read_text()
    assert "include /etc/nginx/snippets/authsvc-forwarded-edge.conf;" in proxy
    assert (
        "proxy_set_header"
        not in (root / "etc/nginx/snippets/authsvc-forwarded-edge.conf").read_text()
    )
    assert (
        "ExecStart=/opt/authsvc/venv/bin/gunicorn --config /opt/authsvc/gunicorn.conf.py"
        in (root / "etc/systemd/system/authsvc.service").read_text()
    )
    # The steps that need root are skipped, visibly.
    for step in (
        "useradd",
        "groupadd --system authsvc-admin",
        "chown",
        "systemctl daemon-reload",
        "nginx -t",
    ):
        assert any(
            line.startswith("skip: ") and step in line for line in first.stdout.splitlines()
        ), step
    # `authsvc init` ran: the store answers the admin command.
    assert json.loads(_admin(root, "game", "list", "--json")) == {"games": []}
    # An upgrade restarts every unit it installed that runs the previous release's code, and starts
    # none.
    assert (
        "skip: systemctl try-restart authsvc-deliver.service authsvc-heartbeat.service "
        "authsvc-admin.service (staged"
    ) in first.stdout


def test_install_migrates_a_postgresql_store_as_the_owner_of_owner_toml(tmp_path, pg_databases):
    """With CONF_DIR/owner.toml the upgrade's `authsvc init` uses it (docs/operations.md, section
    9): a store of an earlier release (here: none of its migrations yet) is migrated by the role
    that owns it."""
    from authsvc.store.postgres.store import MIGRATIONS

    url = pg_databases.create(migrate=False)
    owner = tmp_path / "etc/authsvc/owner.toml"
    owner.parent.mkdir(parents=True)
    owner.write_text(f'[authsvc]\nstore = "{url}"\n')
    done = _install(tmp_path)
    assert f"schema version {len(MIGRATIONS)} (migrated from 0)" in done.stdout, done.stdout
    assert not (tmp_path / "var/lib/authsvc/authsvc.db").exists()


def test_install_again_keeps_secret_settings_and_store(tmp_path):
    """On an install of its own: it adds a game and reinstalls, which the shared ``staged`` must not
    see."""
    root = tmp_path
    _install(root)
    secret = (root / "etc/authsvc/token-secret").read_text()
    assert len(secret.strip()) == 64
    settings = root / "etc/authsvc/authsvc.toml"
    text = settings.read_text()
    assert '# error_status = "200"' in text and "# max_body_bytes = 16384" in text
    settings.write_text(
        text.replace('# error_status = "200"', 'error_status = "http"').replace(
            "# max_body_bytes = 16384", "max_body_bytes = 65536"
        )
    )
    game = json.loads(_admin(root, "game", "add", "Chess", "--json"))
    _admin(root, "player", "add", "42", "alice")
    token = _admin(root, "token", "issue", "--game", str(game["game_id"]), "--user", "42").strip()

    again = _install(root)

    assert (
        "token-secret exists, kept" in again.stdout and "authsvc.toml exists, kept" in again.stdout
    )
    assert (root / "etc/authsvc/token-secret").read_text() == secret
    assert 'error_status = "http"' in settings.read_text()
    # The kept file's max_body_bytes is nginx's limit now (before, nginx stayed at 16k).
    assert _body_limits(root) == ("65536", "65536")
    assert (
        _admin(root, "token", "issue", "--game", str(game["game_id"]), "--user", "42").strip()
        == token
    )
    assert [g["name"] for g in json.loads(_admin(root, "game", "list", "--json"))["games"]] == [
        "Chess"
    ]
    assert game["api_key"] not in again.stdout + again.stderr


def test_installed_gunicorn_loads_the_app_with_the_installed_config(staged):
    root, _ = staged
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AUTHSVC_CONFIG": str(root / "etc/authsvc/authsvc.toml"),
        "AUTHSVC_STORE": f"sqlite://{root}/var/lib/authsvc/authsvc.db",
        "CREDENTIALS_DIRECTORY": str(
            root / "etc/authsvc"
        ),  # holds token-secret, as systemd's would
        "STATE_DIRECTORY": str(root / "var/lib/authsvc"),
        "HOME": str(root),
    }
    done = subprocess.run(
        [
            str(root / "opt/authsvc/venv/bin/gunicorn"),
            "--check-config",
            "--config",
            str(root / "opt/authsvc/gunicorn.conf.py"),
            "authsvc.wsgi:application",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_installed_admin_service_loads_the_admin_api_with_its_settings(staged):
    """authsvc-admin.service's command line and settings, as installed: the admin app loads and
    writes the store."""
    root, first = staged
    service = (root / "etc/systemd/system/authsvc-admin.service").read_text()
    assert re.search(
        r"^ExecStart=/opt/authsvc/venv/bin/gunicorn --config /opt/authsvc/gunicorn.conf.py "
        r"authsvc.api.wsgi:create_app\(\)$",
        service,
        re.M,
    )
    assert "Environment=AUTHSVC_CONFIG=/etc/authsvc/admin.toml" in service
    socket_unit = (root / "etc/systemd/system/authsvc-admin.socket").read_text()
    for line in (
        "ListenStream=/run/authsvc-admin.sock",
        "SocketGroup=authsvc-admin",
        "SocketMode=0660",
    ):
        assert re.search(rf"^{re.escape(line)}$", socket_unit, re.M), line
    # Installed, not enabled, without --admin; and the output says how.
    assert "authsvc-admin (the admin API) installed, not enabled" in first.stdout
    admin_toml = root / "etc/authsvc/admin.toml"
    assert 'store = "sqlite:///var/lib/authsvc/authsvc.db"' in admin_toml.read_text()
    staged_toml = root / "admin-staged.toml"
    staged_toml.write_text(
        admin_toml.read_text().replace("sqlite:///var/lib", f"sqlite://{root}/var/lib")
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AUTHSVC_CONFIG": str(staged_toml),
        "CREDENTIALS_DIRECTORY": str(root / "etc/authsvc"),
        "STATE_DIRECTORY": str(root / "var/lib/authsvc"),
        "HOME": str(root),
    }
    done = subprocess.run(
        [
            str(root / "opt/authsvc/venv/bin/gunicorn"),
            "--check-config",
            "--config",
            str(root / "opt/authsvc/gunicorn.conf.py"),
            "authsvc.api.wsgi:application",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_install_admin_enables_the_admin_service(tmp_path):
    done = _install(tmp_path, "--admin")
    assert any(
        line.startswith("skip: ") and "enable --now authsvc-admin.socket" in line
        for line in done.stdout.splitlines()
    ), done.stdout
    # The other units it installed are restarted if they run (an upgrade); the admin API's is
    # restarted above.
    assert (
        "skip: systemctl try-restart authsvc-deliver.service authsvc-heartbeat.service (staged"
        in done.stdout
    )
    # --admin alone exposes nothing through nginx.
    assert not (tmp_path / "etc/nginx/sites-enabled/authsvc-admin.conf").exists()


def test_the_admin_server_of_nginx_is_off_unless_asked_for(staged, tmp_path):
    root, _ = staged
    assert (root / "etc/nginx/sites-available/authsvc-admin.conf").exists()
    assert not (root / "etc/nginx/sites-enabled/authsvc-admin.conf").exists()
    done = _install(
        tmp_path, "--admin-host", "admin.example.com", "--set", "ADMIN_ALLOW=10.0.0.0/24 10.1.0.7"
    )
    link = tmp_path / "etc/nginx/sites-enabled/authsvc-admin.conf"
    assert os.readlink(link) == "/etc/nginx/sites-available/authsvc-admin.conf"
    site = (tmp_path / "etc/nginx/sites-available/authsvc-admin.conf").read_text()
    assert "server_name admin.example.com;" in site
    assert "ssl_certificate     /etc/letsencrypt/live/admin.example.com/fullchain.pem;" in site
    assert re.findall(r"^\s*(allow \S+;|deny all;)$", site, re.M) == [
        "allow 10.0.0.0/24;",
        "allow 10.1.0.7;",
        "deny all;",
    ]
    assert "listen 127.0.0.1:8443 ssl;" in site
    assert "server unix:/run/authsvc-admin.sock;" in site
    assert any(
        line.startswith("skip: ") and "usermod -a -G authsvc-admin www-data" in line
        for line in done.stdout.splitlines()
    ), done.stdout


def test_install_honours_layout_values(tmp_path):
    """--set APP_DIR/CONF_DIR/NGINX_DIR move the venv, config, units, wrapper and site; nothing
    lands in the defaults."""
    root = tmp_path / "stage"
    _install(
        root,
        "--set",
        "APP_DIR=/srv/authsvc-app",
        "--set",
        "CONF_DIR=/srv/authsvc-etc",
        "--set",
        "NGINX_DIR=/srv/nginx",
    )
    for rel in (
        "srv/authsvc-app/venv/bin/gunicorn",
        "srv/authsvc-app/venv/bin/authsvc",
        "srv/authsvc-app/gunicorn.conf.py",
        "srv/authsvc-app/docs/operations.md",
        "srv/authsvc-etc/authsvc.toml",
        "srv/authsvc-etc/token-secret",
        "srv/nginx/sites-available/authsvc.conf",
        "srv/nginx/snippets/authsvc-tls.conf",
    ):
        assert (root / rel).exists(), rel
    assert (
        os.readlink(root / "srv/nginx/sites-enabled/authsvc.conf")
        == "/srv/nginx/sites-available/authsvc.conf"
    )
    for rel in ("opt/authsvc", "etc/authsvc", "etc/nginx"):
        assert not (root / rel).exists(), rel
    service = (root / "etc/systemd/system/authsvc.service").read_text()
    assert (
        "ExecStart=/srv/authsvc-app/venv/bin/gunicorn --config /srv/authsvc-app/gunicorn.conf.py"
        in service
    )
    assert "Environment=AUTHSVC_TOKEN_SECRET_FILE=/srv/authsvc-etc/token-secret" in service
    assert "AUTHSVC_CONFIG=/srv/authsvc-etc/authsvc.toml" in service
    wrapper = (root / "usr/local/bin/authsvc").read_text()
    assert "cmd=/srv/authsvc-app/venv/bin/authsvc" in wrapper
    assert "AUTHSVC_CONFIG=/srv/authsvc-etc/authsvc.toml" in wrapper
    for text in (service, wrapper, (root / "srv/nginx/sites-available/authsvc.conf").read_text()):
        assert "/opt/authsvc" not in text and "/etc/authsvc" not in text and str(root) not in text


@pytest.mark.parametrize(
    "value", ["APP_DIR=srv/app", "CONF_DIR=", "APP_DIR=/srv/a b", "MAX_BODY_BYTES=65536"]
)  # that one comes from the settings file only
def test_install_refuses_bad_layout_values_before_writing(tmp_path, value):
    root = tmp_path / "stage"
    done = _run_install(root, "--set", value)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not root.exists() or not any(root.iterdir())


def _as(user: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={user}",
            f"--regid={pwd.getpwnam(user).pw_gid}",
            "--init-groups",
            "--inh-caps=-all",
            *cmd,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


def test_admin_wrapper_writes_the_store_as_the_service_user():
    """/usr/local/bin/authsvc run by root: the store's files belong to the service user, 0600.

    Rendered with USER=nobody (the suite creates no system user), in a directory
    nobody can reach.
    """
    if os.geteuid() != 0:
        skip_or_fail("the admin wrapper switches to the service user: run the suite as root")
    if shutil.which("setpriv") is None:
        skip_or_fail("setpriv (util-linux) is not installed")
    if _as("nobody", [sys.executable, "-c", "import authsvc"]).returncode != 0:
        skip_or_fail("the user nobody cannot run this virtualenv's Python")
    base = Path(tempfile.mkdtemp(prefix="authsvc-wrapper-"))
    try:
        base.chmod(0o755)
        (base / "app").mkdir()
        (base / "app/venv").symlink_to(Path(sys.prefix))
        etc, state = base / "etc", base / "state"
        etc.mkdir(mode=0o755)
        state.mkdir(mode=0o750)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "authsvc.deployment",
                str(REPO / "deploy"),
                str(base / "r"),
                "--set",
                "API_HOST=a.example",
                "--set",
                "LEGACY_HOST=b.example",
                "--set",
                "USER=nobody",
                "--set",
                f"APP_DIR={base / 'app'}",
                "--set",
                f"CONF_DIR={etc}",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        (etc / "authsvc.toml").write_text(f'[authsvc]\nstore = "sqlite://{state}/authsvc.db"\n')
        secret = etc / "token-secret"
        secret.write_text(secrets.token_hex(32) + "\n")
        secret.chmod(0o600)
        nobody = pwd.getpwnam("nobody")
        for path in (secret, state):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        wrapper = str(base / "r/bin/authsvc")

        def admin(*args):
            done = subprocess.run(
                [wrapper, *args], capture_output=True, text=True, timeout=60, cwd=base
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        admin("init")
        game = json.loads(admin("game", "add", "Chess", "--json"))
        admin("player", "add", "42", "alice")
        token = admin("token", "issue", "--game", str(game["game_id"]), "--user", "42").strip()
        assert len(token) == 64
        for path in state.iterdir():
            st = path.stat()
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (nobody.pw_uid, 0o600), path
        # The service user can read what the admin wrote.
        read = _as(
            "nobody",
            [
                sys.executable,
                "-c",
                "import sqlite3, sys; print(sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', "
                "uri=True).execute('select count(*) from players').fetchone()[0])",
                str(state / "authsvc.db"),
            ],
        )
        assert read.stdout.strip() == "1", read.stderr
        # Anyone else is turned away.
        other = _as("daemon", [wrapper, "game", "list"], cwd="/")
        assert other.returncode == 1 and "run this as root" in other.stderr
        # AUTHSVC_CONFIG names other settings (admin.toml, owner.toml): the wrapper keeps them.
        (etc / "owner.toml").write_text(f'[authsvc]\nstore = "sqlite://{state}/other.db"\n')
        done = subprocess.run(
            [wrapper, "init"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=base,
            env={**os.environ, "AUTHSVC_CONFIG": str(etc / "owner.toml")},
        )
        assert done.returncode == 0 and f"sqlite://{state}/other.db" in done.stdout, (
            done.stdout + done.stderr
        )
    finally:
        shutil.rmtree(base)
