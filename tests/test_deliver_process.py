"""A real ``authsvc deliver`` process against a receiver on loopback: one player's six events arrive in
order within 2 s of each change, signed so that the ``standardwebhooks`` package verifies them; a
receiver down for 5 s gets every missed event once back; killed with SIGKILL mid-run, it loses no
event (at least once: a duplicate keeps its webhook-id) and keeps a player's events in order; it
stops cleanly on SIGTERM, and never writes a webhook's secret to its log."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from standardwebhooks.webhooks import Webhook

from tests.support import Receiver, add_webhook, free_port, store_sql

SECRET = "whsec_" + base64.b64encode(b"the deliverer's own secret").decode()
PLAYERS = 300
RENAMES = 20


def start(env: dict, port: int, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "authsvc.admin.command", "deliver"],
        env={**os.environ, **env, "AUTHSVC_WEBHOOK_ALLOW_HOSTS": f"127.0.0.1:{port}", "AUTHSVC_DELIVER_CONCURRENCY": "4"},
        stdout=log, stderr=subprocess.STDOUT,
    )


def until(predicate, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {seconds:g} s for {what}")
        time.sleep(0.05)


def test_one_player_s_six_events_arrive_in_order_each_within_2_s_and_verified(env, admin_store, store_url, tmp_path):
    arrived: dict[str, float] = {}

    def note(headers, body):
        arrived[headers["webhook-id"]] = time.monotonic()
        return 204

    receiver = Receiver(note)
    changes = [("player.created", lambda: admin_store.add_player(7, "bob")),
               ("player.renamed", lambda: admin_store.rename_player(7, "robert")),
               ("player.disabled", lambda: admin_store.set_player_enabled(7, False)),
               ("player.enabled", lambda: admin_store.set_player_enabled(7, True)),
               ("player.revoked", lambda: admin_store.revoke_player(7)),
               ("player.deleted", lambda: admin_store.delete_player(7))]
    try:
        add_webhook(store_url, receiver.url(), [t for t, _ in changes], SECRET)
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, receiver.port, log)
            try:
                made = []
                for n, (_, change) in enumerate(changes, start=1):
                    change()
                    made.append(time.monotonic())
                    until(lambda n=n: len(receiver.requests) == n, f"delivery {n}", 10)
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        verified = [Webhook(SECRET).verify(body, headers) for headers, body in receiver.requests]
        assert [v["type"] for v in verified] == [t for t, _ in changes]
        assert [v["data"] for v in verified] == [
            {"user_id": 7, "username": "bob", "epoch": 0}, {"user_id": 7, "username": "robert", "epoch": 0},
            {"user_id": 7, "username": "robert", "epoch": 0}, {"user_id": 7, "username": "robert", "epoch": 0},
            {"user_id": 7, "username": "robert", "epoch": 1}, {"user_id": 7, "epoch": 1}]
        waits = [arrived[headers["webhook-id"]] - at for (headers, _), at in zip(receiver.requests, made, strict=True)]
        assert max(waits) <= 2.0, waits
    finally:
        receiver.close()


def test_a_receiver_down_for_5_s_gets_every_missed_event_once_it_is_back(env, admin_store, store_url, tmp_path):
    port = free_port()
    receiver = None
    try:
        add_webhook(store_url, f"http://127.0.0.1:{port}/hook", ["player.created", "player.renamed"], SECRET)
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, port, log)
            try:
                down = time.monotonic()
                for user_id in (1, 2, 3):
                    admin_store.add_player(user_id, f"p{user_id}")
                admin_store.rename_player(1, "p1-b")
                until(lambda: store_sql(store_url, "SELECT count(*) FROM deliveries WHERE attempts > 0")[0][0] == 3,
                      "a refused first attempt for each player", 10)
                time.sleep(max(0.0, 5.0 - (time.monotonic() - down)))
                receiver = Receiver(port=port)
                until(lambda: len(receiver.requests) == 4, "the missed events", 30)
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        got = [(b["data"]["user_id"], b["type"], b["data"]["username"]) for b in receiver.bodies()]
        assert sorted(got) == [(1, "player.created", "p1"), (1, "player.renamed", "p1-b"),
                               (2, "player.created", "p2"), (3, "player.created", "p3")]
        assert [g for g in got if g[0] == 1] == [(1, "player.created", "p1"), (1, "player.renamed", "p1-b")]
        assert store_sql(store_url, "SELECT count(*) FROM deliveries WHERE state = 'delivered'") == [(4,)]
    finally:
        if receiver is not None:
            receiver.close()


@pytest.mark.slow
def test_a_deliverer_killed_mid_run_loses_no_event_and_keeps_each_player_s_order(env, admin_store, store_url, tmp_path):
    def slowly(headers, body):
        time.sleep(0.005)
        return 200

    receiver = Receiver(slowly)
    processes = []
    log_path = tmp_path / "deliver.log"
    try:
        add_webhook(store_url, receiver.url(), ["player.created", "player.renamed"], SECRET)
        admin_store.upsert_players([(i, f"p{i}") for i in range(1, PLAYERS + 1)])
        for n in range(1, RENAMES + 1):
            admin_store.rename_player(1, f"p1-{n}")
        total = PLAYERS + RENAMES
        with open(log_path, "ab") as log:
            processes.append(start(env, receiver.port, log))
            until(lambda: len(receiver.requests) >= 60, "the first deliveries")
            processes[0].send_signal(signal.SIGKILL)
            processes[0].wait(10)
            assert len(receiver.requests) < total, "the kill came too late to test anything"
            processes.append(start(env, receiver.port, log))
            until(lambda: store_sql(store_url, "SELECT count(*) FROM deliveries WHERE state = 'delivered'")[0][0] == total,
                  "every delivery marked delivered")
            processes[1].send_signal(signal.SIGTERM)
            assert processes[1].wait(30) == 0
        received = receiver.bodies()
        assert {(b["type"], b["data"]["user_id"], b["data"]["username"]) for b in received} == (
            {("player.created", i, f"p{i}") for i in range(1, PLAYERS + 1)}
            | {("player.renamed", 1, f"p1-{n}") for n in range(1, RENAMES + 1)})
        by_id: dict[str, set[bytes]] = {}
        for headers, body in receiver.requests:
            by_id.setdefault(headers["webhook-id"], set()).add(body)
        assert len(by_id) == total and all(len(bodies) == 1 for bodies in by_id.values())
        firsts: list[str] = []
        for b in received:
            if b["data"]["user_id"] == 1 and b["data"]["username"] not in firsts:
                firsts.append(b["data"]["username"])
        assert firsts == ["p1"] + [f"p1-{n}" for n in range(1, RENAMES + 1)]
        log_text = log_path.read_text()
        assert "authsvc deliver: stopped" in log_text
        assert SECRET not in log_text and SECRET.removeprefix("whsec_") not in log_text
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        receiver.close()


def test_a_failing_receiver_is_logged_without_the_secret_or_the_url_s_query(env, admin_store, store_url, tmp_path):
    receiver = Receiver(lambda headers, body: 500)
    log_path = tmp_path / "deliver.log"
    try:
        add_webhook(store_url, receiver.url("/hook?token=" + SECRET), ["player.created"], SECRET)
        admin_store.add_player(7, "bob")
        with open(log_path, "ab") as log:
            process = start(env, receiver.port, log)
            try:
                until(lambda: store_sql(store_url, "SELECT attempts FROM deliveries") == [(1,)], "the first attempt")
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        log_text = log_path.read_text()
        assert f"webhook 1: 127.0.0.1:{receiver.port} answered 500" in log_text
        assert SECRET.removeprefix("whsec_") not in log_text and "token=" not in log_text
        assert store_sql(store_url, "SELECT last_error FROM deliveries") == [("answered 500",)]  # the host: the log's
    finally:
        receiver.close()


def test_sigterm_lets_the_post_under_way_end_and_records_it(env, admin_store, store_url, tmp_path):
    started = threading.Event()

    def slowly(headers, body):
        started.set()
        time.sleep(1.0)
        return 200

    receiver = Receiver(slowly)
    try:
        add_webhook(store_url, receiver.url(), ["player.created"], SECRET)
        admin_store.add_player(7, "bob")
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, receiver.port, log)
            try:
                assert started.wait(30), "no POST came"
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        assert store_sql(store_url, "SELECT state, attempts FROM deliveries") == [("delivered", 1)]
        assert len(receiver.requests) == 1
    finally:
        receiver.close()
