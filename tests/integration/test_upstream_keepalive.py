"""nginx keeps its connections to a TCP app host open: no TIME-WAIT socket per authentication.

docs/scaling.md ("Connections between nginx and the app hosts"). Sync workers answer
"Connection: close", so nginx opens a TCP connection per request to an app host on
another machine, and each one closed leaves a TIME-WAIT socket for 60 s: at ~2,000
authentications a second per app host that is the whole ephemeral port range, and
connect() fails or spins. gthread workers keep the connection (gunicorn's keepalive,
5 s), and the shipped upstream block keeps up to 16 idle ones per nginx worker
(``keepalive``), closed before gunicorn would (``keepalive_timeout 4s``).

The shipped nginx site and gunicorn.conf.py (tests/deploy_support.py), one app host
on its unix socket and one on a loopback TCP port, driven by wrk; the TIME-WAIT
sockets of the TCP app host's port are counted before and after.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.deploy_support import LEGACY_HOST, start_stack, stop
from tests.support import skip_or_fail


def time_wait(port: int) -> int:
    """TIME-WAIT sockets of connections to or from ``port`` on this machine."""
    out = subprocess.run(
        ["ss", "-Htan", "state", "time-wait", f"( sport = :{port} or dport = :{port} )"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return len([line for line in out.splitlines() if line.strip()])


@pytest.mark.parametrize("worker_class", ["gthread", "sync"])
def test_tcp_app_host_connections_are_kept(worker_class, tmp_path):
    """gthread (what docs/scaling.md tells a TCP app host to run): nginx reuses its connections, a
    few TIME-WAIT sockets for thousands of answers. sync: one per answer, the rate that ran nginx
    out of ports."""
    if shutil.which("wrk") is None or shutil.which("ss") is None:
        skip_or_fail("wrk and ss are needed (Debian: apt-get install wrk iproute2)")
    stack = start_stack(
        tmp_path,
        extra_app_hosts=1,
        # No queue-wait shedding: on a busy machine wrk's 8 connections wait over the shipped
        # 0.5 s and a few answers were 503 (a CI run beside other work: 3 of 9,445). The shed has
        # its own tests (tests/functional/test_queueing.py); here every answer must be a 200.
        app_env={"AUTHSVC_MAX_QUEUE_WAIT": "0"},
        app_host_env={"AUTHSVC_WORKER_CLASS": worker_class},
        values={"RATE": "1000000r/s", "RATE_BURST": "100000", "CONN_LIMIT": "10000"},
    )
    try:
        address, _ = stack.app_hosts[0]
        port = int(address.rsplit(":", 1)[1])
        before = time_wait(port)
        run = subprocess.run(
            [
                "wrk",
                "-t2",
                "-c8",
                "-d4s",
                "-H",
                f"Host: {LEGACY_HOST}",
                f"http://127.0.0.1:{stack.http_port}{stack.api_query()}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        left = time_wait(port) - before
        log = (stack.logs / "authsvc-access.log").read_text()
        served = sum(
            1 for line in log.splitlines() if f'addr="{address}"' in line and " 200 " in line
        )
        rate = re.search(r"Requests/sec:\s+([\d.]+)", run.stdout)
        print(
            f"{worker_class}: {served} answers from the TCP app host, {left} TIME-WAIT, "
            f"{rate.group(1) if rate else '?'} req/s in all"
        )
        assert "Non-2xx" not in run.stdout and "Socket errors" not in run.stdout, run.stdout
        assert served >= 500, run.stdout  # enough answers for the count to mean something
        if worker_class == "gthread":
            assert left < served / 20, (
                f"{left} TIME-WAIT sockets for {served} answers: connections not kept"
            )
        else:
            # Not one per answer: on loopback the kernel reuses a TIME-WAIT port after 1 s
            # (tcp_tw_reuse = 2, the default, is loopback only); across a network it does not
            # (docs/scaling.md).
            assert left > served / 10, (
                f"{left} TIME-WAIT sockets for {served} answers: sync workers keep connections?"
            )
    finally:
        stop(stack.nginx)
        stop(stack.gunicorn)
        for _, proc in stack.app_hosts:
            stop(proc)
