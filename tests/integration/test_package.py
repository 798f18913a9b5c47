"""scripts/package's .deb in a booted Debian 12 (systemd as PID 1 in systemd-nspawn, private
network): install, serve, upgrade while serving, remove, purge (docs/operations.md, sections 2, 9,
14)."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
CACHE = Path("/var/cache/authsvc-test-bookworm")
BASE_PACKAGES = "systemd,systemd-sysv,dbus,python3,ca-certificates,adduser,nginx-light,curl"


def _version() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _bookworm() -> Path:
    """A debootstrapped Debian 12, made once a day (network to deb.debian.org) and copied per
    run."""
    base = CACHE / datetime.date.today().isoformat()
    if not base.exists():
        tmp = base.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                str(tmp),
                "http://deb.debian.org/debian",
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            skip_or_fail(f"debootstrap bookworm failed: {done.stderr[-500:]}")
        tmp.rename(base)
    return base


class Machine:
    """A booted container: commands run in its namespaces with nsenter (the host may have no
    systemd)."""

    def __init__(self, root: Path):
        self.proc = subprocess.Popen(
            [
                "systemd-nspawn",
                "-D",
                str(root),
                "--boot",
                "--register=no",
                "--keep-unit",
                "--private-network",
                f"--machine=authsvc-test-{os.getpid()}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.init = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            kids = subprocess.run(
                ["ps", "-o", "pid=,comm=", "--ppid", str(self.proc.pid)],
                capture_output=True,
                text=True,
            ).stdout.split()
            if len(kids) >= 2 and kids[1] == "systemd":
                self.init = int(kids[0])
                state = self.sh("systemctl is-system-running --wait", check=False).stdout.strip()
                if state in ("running", "degraded"):
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(1)
        self.close()
        skip_or_fail("systemd-nspawn --boot did not boot the container")

    def sh(
        self, script: str, check: bool = True, timeout: int = 600
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["nsenter", "-t", str(self.init), "-a", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
        return done

    def close(self) -> None:
        if self.init and self.proc.poll() is None:
            self.sh("systemctl poweroff", check=False)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


API, LEGACY = "api.authsvc.test", "legacy.authsvc.test"
# Through nginx, to the container's own loopback: the HTTPS host with the test CA, the legacy host
# in plain HTTP.
ASK = (
    f"curl -s --cacert /srv/tls/ca.pem --resolve {API}:443:127.0.0.1 "
    f"'https://{API}/api/authenticate.json?{{}}'"
)
ASK_LEGACY = f"curl -s --resolve {LEGACY}:80:127.0.0.1 'http://{LEGACY}/api/authenticate.json?{{}}'"
SUCCESS = '{"success":true,"user_id":42,"username":"alice"}'


def _tls(root: Path) -> None:
    """A CA and the API host's certificate (trustme) at /srv/tls in the container: the CA for curl
    and authsvc check."""
    import trustme

    ca = trustme.CA()
    tls = root / "srv/tls"
    tls.mkdir(parents=True)
    ca.cert_pem.write_to_path(str(tls / "ca.pem"))
    issued = ca.issue_cert(API)
    issued.cert_chain_pems[0].write_to_path(str(tls / "cert.pem"))
    for pem in issued.cert_chain_pems[1:]:
        pem.write_to_path(str(tls / "cert.pem"), append=True)
    issued.private_key_pem.write_to_path(str(tls / "key.pem"))
    (tls / "key.pem").chmod(0o600)


def test_package_installs_upgrades_while_serving_removes_and_purges(tmp_path):
    if os.geteuid() != 0:
        skip_or_fail("needs root (debootstrap, systemd-nspawn)")
    for tool in ("debootstrap", "systemd-nspawn", "nsenter", "dpkg-deb"):
        if shutil.which(tool) is None:
            skip_or_fail(
                f"{tool} is not installed (.ci/run installs debootstrap and systemd-container)"
            )
    if not Path("/usr/bin/python3").exists():
        skip_or_fail("/usr/bin/python3 is missing: scripts/package builds the virtualenv with it")
    version = _version()
    debs = {}
    for v in (
        version,
        version + ".1",
    ):  # the second: a higher version to upgrade to, for this test only
        out = tmp_path / v
        env = dict(os.environ, AUTHSVC_PACKAGE_VERSION=v)
        done = subprocess.run(
            [str(REPO / "scripts/package"), "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        debs[v] = Path(done.stdout.strip().splitlines()[-1])
    lint = (
        subprocess.run(
            ["lintian", "--fail-on", "error,warning", str(debs[version])],
            capture_output=True,
            text=True,
        )
        if shutil.which("lintian")
        else None
    )
    if lint is not None:
        assert lint.returncode == 0, lint.stdout + lint.stderr

    root = tmp_path / "bookworm"
    subprocess.run(["cp", "-a", str(_bookworm()), str(root)], check=True)
    for deb in debs.values():
        shutil.copy(deb, root / "root" / deb.name)
    _tls(root)
    machine = Machine(root)
    try:
        started = time.monotonic()
        machine.sh(f"cd /root && apt-get install -y ./{debs[version].name}")
        install_time = time.monotonic() - started
        assert (
            machine.sh("systemctl is-active authsvc.socket authsvc.service").stdout.split()
            == ["active"] * 2
        )
        # Installed, not enabled.
        assert machine.sh(
            "systemctl is-enabled authsvc-admin.socket authsvc-deliver.service", check=False
        ).stdout.split() == ["disabled", "disabled"]
        assert machine.sh("authsvc --version").stdout.strip() == f"authsvc {version}"
        assert not machine.sh("ls /etc/nginx/sites-enabled").stdout.count("authsvc")
        setup = machine.sh(
            f"authsvc setup --api-host {API} --legacy-host {LEGACY}"
            " --cert /srv/tls/cert.pem --key /srv/tls/key.pem"
        )
        assert f"nginx serves https://{API} and http://{LEGACY}" in setup.stdout, setup.stdout
        assert machine.sh(
            "readlink /etc/nginx/sites-enabled/authsvc.conf; ls /etc/nginx/sites-enabled"
        ).stdout.split() == [
            "/etc/nginx/sites-available/authsvc.conf",
            "authsvc.conf",
        ]  # Debian's default site gone
        game = machine.sh(
            "authsvc game add Chess --json | python3 -c 'import json,sys; g=json.load(sys.stdin);"
            ' print(g["game_id"], g["api_key"])\''
        ).stdout.split()
        machine.sh("authsvc player add 42 alice")
        token = machine.sh(f"authsvc token issue --game {game[0]} --user 42").stdout.strip()
        good = f"user_id=42&game_auth_token={token}&api_key={game[1]}"
        bad_key = f"user_id=42&game_auth_token={token}&api_key=00000000-0000-0000-0000-000000000000"
        for ask in (ASK, ASK_LEGACY):
            assert machine.sh(ask.format(good)).stdout == SUCCESS
            assert '"error":403' in machine.sh(ask.format(bad_key)).stdout
            assert '"error":400' in machine.sh(ask.format("user_id=x")).stdout
        # The key file for authsvc check, which runs as the service user.
        machine.sh(f"umask 077 && echo {game[1]} >/srv/key && chown authsvc /srv/key")
        check = machine.sh(
            f"authsvc check --base-url https://{API} --base-url http://{LEGACY} --game-id {game[0]}"
            f" --user-id 42 --api-key-file /srv/key --cafile /srv/tls/ca.pem"
            f" --resolve {API}:443:127.0.0.1 --resolve {LEGACY}:80:127.0.0.1",
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        secret = machine.sh("cat /etc/authsvc/token-secret").stdout
        machine.sh("echo '# kept' >>/etc/authsvc/authsvc.toml")

        # Upgrade while a loop of authentications through nginx runs: every answer a success. The
        # loop is paced under nginx's rate per client address (RATE, 20 r/s), which would answer 429
        # past its burst.
        machine.sh(
            "rm -f /root/answers; (while [ ! -e /root/stop ]; do "
            + ASK.format(good)
            + " >>/root/answers; echo >>/root/answers; sleep 0.1; done) >/dev/null 2>&1 &"
        )
        started = time.monotonic()
        done = machine.sh(f"cd /root && apt-get install -y ./{debs[version + '.1'].name}")
        upgrade_time = time.monotonic() - started
        time.sleep(2)
        machine.sh("touch /root/stop; sleep 1")
        answers = machine.sh("cat /root/answers").stdout.splitlines()
        refused = [a for a in answers if a != SUCCESS]
        print(
            f"\npackage {debs[version].name}: {debs[version].stat().st_size} bytes;"
            f" install {install_time:.1f} s; upgrade {upgrade_time:.1f} s,"
            f" {len(answers)} authentications through nginx during it, {len(refused)} refused"
        )
        assert len(answers) > 10 and refused == [], refused[:5]
        assert machine.sh("authsvc --version").stdout.strip() == f"authsvc {version}.1"
        assert machine.sh("cat /etc/authsvc/token-secret").stdout == secret
        assert "# kept" in machine.sh("cat /etc/authsvc/authsvc.toml").stdout
        assert machine.sh(ASK.format(good)).stdout == SUCCESS

        # A downgrade is refused, saying how to go back.
        down = machine.sh(f"cd /root && dpkg -i ./{debs[version].name}", check=False)
        assert (
            down.returncode != 0 and "restore the backup taken before the upgrade" in down.stderr
        ), down.stderr

        # Remove: units stopped and disabled, settings and store kept.
        machine.sh("apt-get remove -y authsvc")
        assert (
            machine.sh(
                "systemctl is-active authsvc.socket authsvc.service", check=False
            ).stdout.split()
            == ["inactive"] * 2
        )
        assert (
            machine.sh(
                "test -e /etc/authsvc/token-secret && test -e /var/lib/authsvc/authsvc.db"
                " && test ! -e /usr/lib/authsvc",
                check=False,
            ).returncode
            == 0
        )
        # Installed again: enabled and serving as before (the store, the secret, nginx's site kept),
        # and the units left not enabled can be enabled (not masked).
        machine.sh(f"cd /root && apt-get install -y ./{debs[version + '.1'].name}")
        assert (
            machine.sh(
                "systemctl is-enabled authsvc.socket authsvc.service authsvc-admin.socket"
                " authsvc-admin.service authsvc-deliver.service authsvc-heartbeat.service",
                check=False,
            ).stdout.split()
            == ["enabled", "enabled"] + ["disabled"] * 4
        )
        assert (
            machine.sh("systemctl is-active authsvc.socket authsvc.service").stdout.split()
            == ["active"] * 2
        )
        assert machine.sh(ASK.format(good)).stdout == SUCCESS
        assert machine.sh(ASK_LEGACY.format(good)).stdout == SUCCESS
        machine.sh("apt-get remove -y authsvc")
        # Purge: the configuration gone, the store and the user kept, and said so.
        purge = machine.sh("apt-get purge -y authsvc")
        assert "Kept: the store in /var/lib/authsvc" in purge.stdout
        assert (
            machine.sh(
                "test ! -e /etc/authsvc && test -e /var/lib/authsvc/authsvc.db && id authsvc",
                check=False,
            ).returncode
            == 0
        )
    finally:
        machine.close()
