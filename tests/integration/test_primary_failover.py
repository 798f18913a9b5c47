"""A PostgreSQL primary failover under traffic (docs/operations.md, "PostgreSQL primary failover").

A throwaway primary and a ``pg_basebackup -R`` standby (and, for one variant, a
throwaway pgbouncer) from the local binaries; a real gunicorn with two workers
serves authentications to a client thread while the primary is stopped (fast
shutdown) and the standby promoted. Every answer must be the correct one or the
503 JSON; afterwards the service answers correctly again without a restart, and
the admin command works against the new primary. The figures (requests, 503s,
wrong answers, seconds from the promotion to recovery) are printed for the docs:
``scripts/test tests/integration/test_primary_failover.py -s``.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from authsvc.errors import StoreUnavailable
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from tests import factories
from tests.pgserver import (
    Heartbeat,
    ThrowawayPgbouncer,
    ThrowawayPostgres,
    ThrowawayStandby,
    find_bin_dir,
    find_pgbouncer,
    sql,
    wait_replayed,
)
from tests.support import INVALID, PATH, free_port, skip_or_fail, start_gunicorn, wait_for_port

WEB_ROLE = "authsvc_web"
OK = {"success": True, "user_id": 77, "username": "carol"}
UNAVAILABLE = {
    "success": False,
    "error": 503,
    "error_description": "Service temporarily unavailable, try again",
}
RECOVERY_LIMIT = 60  # seconds: a hang, not a figure; the figures are what -s prints (_report)


@dataclasses.dataclass
class Cluster:
    primary: ThrowawayPostgres
    standby: ThrowawayStandby
    settings: Settings
    game_id: int
    api_key: str
    secret_file: str

    def params(self, user_id: int, epoch: int) -> dict:
        token = mint_token(self.settings.token_secrets[0], self.game_id, user_id, epoch)
        return {"user_id": str(user_id), "game_auth_token": token, "api_key": self.api_key}

    def web_url(self, port: int, database: str = "postgres") -> str:
        return f"postgresql://{WEB_ROLE}@127.0.0.1:{port}/{database}"


@pytest.fixture
def cluster(secret_file, tmp_path):
    """Primary and standby with one game, player 77 (carol, valid) and 78 (dave, revoked once), and
    the read-only web role with the settings pgbouncer cannot pass (docs/stores.md, "pgbouncer")."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        skip_or_fail("PostgreSQL binaries (initdb, pg_ctl, pg_basebackup) not found")
    primary = ThrowawayPostgres(bin_dir)
    standby = heartbeat = None
    try:
        primary.start()
        settings = Settings.from_env(
            {
                "AUTHSVC_STORE": primary.url,
                "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
                "AUTHSVC_MAX_STALENESS": "1",
            }
        )
        api_key = new_api_key()
        admin = open_store(primary.url, readonly=False, settings=settings)
        try:
            admin.migrate()
            game = factories.add_game(admin, "Chess", api_key_digest(api_key), int(time.time()))
            factories.add_player(admin, 77, "carol")
            factories.add_player(admin, 78, "dave")
            assert factories.revoke_player(admin, 78) == 1
        finally:
            admin.close()
        sql(primary.url, f"CREATE ROLE {WEB_ROLE} LOGIN IN ROLE authsvc_reader")
        sql(primary.url, f"ALTER ROLE {WEB_ROLE} SET default_transaction_read_only = on")
        sql(primary.url, f"ALTER ROLE {WEB_ROLE} SET statement_timeout = '1s'")
        standby = ThrowawayStandby(primary)
        standby.start()
        # The writer the runbook keeps running: it lets the standby prove its freshness until the
        # primary stops (docs/stores.md, "Hot standby").
        heartbeat = Heartbeat(primary.url, tmp_path / "heartbeat.log")
        heartbeat.start()
        wait_replayed(primary, standby)
        yield Cluster(primary, standby, settings, game.id, api_key, str(secret_file))
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        if standby is not None:
            standby.destroy()
        primary.destroy()


def promote(standby: ThrowawayStandby) -> None:
    """What the runbook's first step runs on the standby: pg_ctl promote, waiting until it is
    done."""
    standby._run("pg_ctl", "-D", standby.data, "-w", "-t", "60", "promote")


# -- the client ------------------------------------------------------------------------------


class Traffic:
    """A client thread: authentications one after another, each on a new connection, alternating a
    valid player (correct: the success) and a revoked token (correct: the 403 JSON); any answer may
    also be the 503 JSON. Every answer is recorded as (finished at, 'ok' | '503' | what was
    wrong)."""

    LIMIT = 20000  # requests: a bound, never reached in a passing run

    def __init__(self, port: int, cluster: Cluster):
        self.port = port
        self.cases = [
            (f"{PATH}?{urllib.parse.urlencode(cluster.params(77, 0))}", OK),
            (f"{PATH}?{urllib.parse.urlencode(cluster.params(78, 0))}", INVALID),
        ]
        self.answers: list[tuple[float, str]] = []
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def ask(self, query: str, expected: dict) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request("GET", query)
            res = conn.getresponse()
            raw = res.read()
        except (OSError, http.client.HTTPException) as e:
            return f"no answer: {type(e).__name__}: {e}"
        finally:
            conn.close()
        try:
            body = json.loads(raw)
        except ValueError:
            return f"not JSON: {res.status} {raw[:200]!r}"
        if res.status == 200 and body == expected:
            return "ok"
        if res.status == 503 and body == UNAVAILABLE:
            return "503"
        return f"wrong: {res.status} {body} (expected {expected})"

    def _run(self) -> None:
        for n in range(self.LIMIT):
            if self._stop.is_set():
                return
            query, expected = self.cases[n % 2]
            started = time.monotonic()
            got = self.ask(query, expected)
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.answers.append((time.monotonic(), got))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait(self, predicate, what: str, limit: float = RECOVERY_LIMIT) -> None:
        deadline = time.monotonic() + limit
        while not predicate():
            assert self._thread.is_alive(), "the client stopped (request limit reached)"
            assert time.monotonic() < deadline, f"no {what} within {limit} s: {self.summary()}"
            time.sleep(0.02)

    def answered_since(self, since: float, outcome: str, count: int = 1) -> bool:
        return sum(1 for at, got in list(self.answers) if at >= since and got == outcome) >= count

    def correct_in_a_row_since(self, since: float, count: int) -> bool:
        tail = [got for at, got in list(self.answers) if at >= since][-count:]
        return len(tail) == count and set(tail) == {"ok"}

    def wrong(self) -> list[str]:
        return [got for _, got in self.answers if got not in ("ok", "503")]

    def recovered_at(self) -> float:
        """When the first answer came after which every answer was correct."""
        last_bad = max((i for i, (_, got) in enumerate(self.answers) if got != "ok"), default=-1)
        return self.answers[last_bad + 1][0]

    def summary(self) -> dict:
        outcomes = [got for _, got in self.answers]
        return {
            "requests": len(outcomes),
            "503": outcomes.count("503"),
            "wrong": len(self.wrong()),
            "slowest_answer_s": round(self.slowest, 2),
        }


def _gunicorn(cluster: Cluster, store_url: str, tmp_path):
    env = {
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": cluster.secret_file,
        "AUTHSVC_PG_CONNECT_TIMEOUT": "2",
        "AUTHSVC_PG_STATEMENT_TIMEOUT": "1",
        "AUTHSVC_MAX_STALENESS": "1",
    }
    port = free_port()
    server = start_gunicorn(
        env,
        "--graceful-timeout",
        "2",
        port=port,
        workers=2,
        preload=True,
        inherit_env=False,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "gunicorn.log", "wb"),
    )
    wait_for_port(port)
    return server, port


def _admin(store_url: str, cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": cluster.secret_file,
        "AUTHSVC_PG_CONNECT_TIMEOUT": "2",
    }
    return subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _after_failover(cluster: Cluster, port: int, traffic: Traffic) -> None:
    """The admin command on the new primary (once its URL points there); the web process sees the
    revoke."""
    done = _admin(
        cluster.primary.url, cluster, "player", "revoke", "77"
    )  # the old URL: refused, clearly
    assert done.returncode == 1 and "is unreachable" in done.stderr, done
    done = _admin(cluster.standby.url, cluster, "player", "revoke", "77")
    assert done.returncode == 0 and "epoch now 1" in done.stdout, done
    old, new = (urllib.parse.urlencode(cluster.params(77, epoch)) for epoch in (0, 1))
    for _ in range(4):  # both workers, whichever answers
        assert traffic.ask(f"{PATH}?{old}", INVALID) == "ok"
        assert traffic.ask(f"{PATH}?{new}", OK) == "ok"
        assert traffic.ask("/readyz", {"success": True, "status": "ready"}) == "ok"


def _report(
    variant: str, traffic: Traffic, stopped: float, promoted: float, **extra: float
) -> dict:
    """The figures printed with -s (docs/operations.md, "PostgreSQL primary failover"): seconds from
    the primary's stop (the promotion's start, ...)
    to the first answer after which every answer was correct; 0 if none was wrong or 503 after
    it."""
    recovered = traffic.recovered_at()
    events = {"s_stop_to_recovery": stopped, "s_promotion_to_recovery": promoted, **extra}
    figures = {
        "variant": variant,
        **traffic.summary(),
        "s_stop_to_promotion": round(promoted - stopped, 2),
        **{name: round(max(0.0, recovered - at), 2) for name, at in events.items()},
    }
    print("\nFAILOVER FIGURES", json.dumps(figures))
    return figures


def test_failover_with_the_web_process_on_the_standby(cluster, tmp_path):
    """AUTHSVC_STORE of the web process points at the standby, which becomes the primary."""
    server, port = _gunicorn(cluster, cluster.web_url(cluster.standby.port), tmp_path)
    try:
        with Traffic(port, cluster) as traffic:
            traffic.wait(
                lambda: traffic.answered_since(0, "ok", 40), "correct answers before the failover"
            )
            stopped = time.monotonic()
            cluster.primary.stop()
            traffic.wait(
                lambda: (
                    traffic.answered_since(stopped, "ok", 20)
                    or traffic.answered_since(stopped, "503", 20)
                ),
                "answers with the primary stopped",
            )
            promoted = time.monotonic()
            promote(cluster.standby)
            traffic.wait(lambda: traffic.correct_in_a_row_since(promoted, 100), "recovery")
        assert server.poll() is None
        assert traffic.wrong() == [], traffic.wrong()[:10]
        _report("web on the standby", traffic, stopped, promoted)
        _after_failover(cluster, port, traffic)
        assert server.poll() is None  # never restarted
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture
def bouncer(cluster):
    """A throwaway pgbouncer in transaction mode in front of the cluster's primary, for the web
    role."""
    binary = find_pgbouncer()
    if binary is None:
        skip_or_fail("pgbouncer is not installed (apt-get install pgbouncer)")
    pool = ThrowawayPgbouncer(binary, WEB_ROLE, cluster.primary.port, cluster.primary.user)
    try:
        wait_for_port(pool.port)
        yield pool
    finally:
        pool.destroy()


def test_failover_through_pgbouncer(cluster, bouncer, tmp_path):
    """The web process goes through pgbouncer, pointing at the primary; the runbook's steps: promote
    the standby, repoint pgbouncer at it and reload pgbouncer. gunicorn is not touched."""
    server = None
    try:
        server, port = _gunicorn(cluster, bouncer.url, tmp_path)
        with Traffic(port, cluster) as traffic:
            traffic.wait(
                lambda: traffic.answered_since(0, "ok", 40), "correct answers before the failover"
            )
            stopped = time.monotonic()
            cluster.primary.stop()
            traffic.wait(
                lambda: traffic.answered_since(stopped, "503", 10), "503s with the primary stopped"
            )
            promoted = time.monotonic()
            promote(cluster.standby)
            reloaded = time.monotonic()
            bouncer.repoint(cluster.standby.port)
            traffic.wait(lambda: traffic.correct_in_a_row_since(reloaded, 100), "recovery")
        assert server.poll() is None
        assert traffic.wrong() == [], (traffic.wrong()[:10], bouncer.log()[-3000:])
        _report("through pgbouncer", traffic, stopped, promoted, s_reload_to_recovery=reloaded)
        _after_failover(cluster, port, traffic)
        assert server.poll() is None
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


def test_a_connection_opened_on_a_standby_follows_its_promotion(cluster):
    """A web connection opened while the server was a standby keeps serving once it is promoted.
    Here the standby was restarted with the primary down, so it cannot prove it is fresh (503) until
    then."""
    cluster.primary.stop()
    cluster.standby.stop()
    cluster.standby.start()
    reader = open_store(
        cluster.web_url(cluster.standby.port), readonly=True, settings=cluster.settings
    )
    digest = api_key_digest(cluster.api_key)
    try:
        with pytest.raises(StoreUnavailable):
            reader.credentials(digest, 77)
        promote(cluster.standby)
        for _ in range(3):  # the same connection: no failure dropped it
            assert reader.credentials(digest, 77).username == "carol"
    finally:
        reader.close()


def test_a_pooled_connection_checks_freshness_whatever_server_answers(cluster, bouncer):
    """Through pgbouncer the server behind one web connection can change (a failover, a repointed
    pool): a connection opened while pgbouncer pointed at the primary must not read a lagging
    standby without the freshness check once pgbouncer is repointed there."""
    reader = None
    try:
        reader = open_store(bouncer.url, readonly=True, settings=cluster.settings)
        digest = api_key_digest(cluster.api_key)
        assert reader.credentials(digest, 77).epoch == 0  # on the primary
        sql(cluster.standby.url, "SELECT pg_wal_replay_pause()")
        admin = open_store(cluster.primary.url, readonly=False, settings=cluster.settings)
        try:
            assert factories.revoke_player(admin, 77) == 1
        finally:
            admin.close()
        time.sleep(
            1.5
        )  # the revoke is older than AUTHSVC_MAX_STALENESS, and not replayed on the standby
        bouncer.repoint(cluster.standby.port)
        deadline = time.monotonic() + 30
        while (
            "closing because: database configuration changed" not in bouncer.log()
        ):  # the old server's link
            assert time.monotonic() < deadline, bouncer.log()[-2000:]
            time.sleep(0.05)
        for _ in range(5):
            with pytest.raises(StoreUnavailable):
                found = reader.credentials(digest, 77)
                print("answered from the standby with epoch", found and found.epoch)
    finally:
        if reader is not None:
            reader.close()
