"""A real ``authsvc deliver`` process against a receiver on loopback: one player's six events arrive
in
order within 2 s of each change, signed so that the ``standardwebhooks`` package verifies them; a
receiver down for 5 s gets every missed event once back; killed with SIGKILL mid-run, it loses no
event (at least once: a duplicate keeps its webhook-id) and keeps a player's events in order; it
stops cleanly on SIGTERM, and never writes a webhook's secret to its log. A deleted player's names
are in no POST that starts after the deletion's answer, whatever was queued or chained; a
blackholed receiver with 1,000 players pending holds up no other webhook."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from standardwebhooks.webhooks import Webhook

from tests import factories
from tests.support import Receiver, add_webhook, free_port, store_sql

SECRET = "whsec_" + base64.b64encode(b"the deliverer's own secret").decode()
PLAYERS = 300
RENAMES = 20


def start(env: dict, port: int, log, *more_ports: int, **settings: str) -> subprocess.Popen:
    allow = ",".join(f"127.0.0.1:{p}" for p in (port, *more_ports))
    return subprocess.Popen(
        [sys.executable, "-m", "authsvc.cli.command", "deliver"],
        env={
            **os.environ,
            **env,
            "AUTHSVC_WEBHOOK_ALLOW_HOSTS": allow,
            "AUTHSVC_DELIVER_CONCURRENCY": "4",
            **settings,
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def until(predicate, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {seconds:g} s for {what}")
        time.sleep(0.05)


def test_one_player_s_six_events_arrive_in_order_each_within_2_s_and_verified(
    env, admin_store, store_url, tmp_path
):
    arrived: dict[str, float] = {}

    def note(headers, body):
        arrived[headers["webhook-id"]] = time.monotonic()
        return 204

    receiver = Receiver(note)
    changes = [
        ("player.created", lambda: factories.add_player(admin_store, 7, "bob")),
        ("player.renamed", lambda: factories.rename_player(admin_store, 7, "robert")),
        ("player.disabled", lambda: factories.set_player_enabled(admin_store, 7, False)),
        ("player.enabled", lambda: factories.set_player_enabled(admin_store, 7, True)),
        ("player.revoked", lambda: factories.revoke_player(admin_store, 7)),
        ("player.deleted", lambda: factories.delete_player(admin_store, 7)),
    ]
    try:
        add_webhook(store_url, receiver.url(), [t for t, _ in changes], SECRET)
        factories.add_player(admin_store, 6, "warm")  # the deliverer is up once this one came
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, receiver.port, log)
            try:
                # Its start (an interpreter, imports, the store) is no part of an event's 2 s: on a
                # busy machine it alone took 5 s. The clock starts once it has delivered.
                until(lambda: len(receiver.requests) == 1, "the deliverer's first delivery")
                made = []
                for n, (_, change) in enumerate(changes, start=2):
                    change()
                    made.append(time.monotonic())
                    until(lambda n=n: len(receiver.requests) == n, f"delivery {n}", 10)
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        verified = [Webhook(SECRET).verify(body, headers) for headers, body in receiver.requests]
        assert [v["type"] for v in verified] == ["player.created"] + [t for t, _ in changes]
        assert [v["data"] for v in verified] == [
            {"user_id": 6, "username": "warm", "epoch": 0},
            {"user_id": 7, "username": "bob", "epoch": 0},
            {"user_id": 7, "username": "robert", "epoch": 0},
            {"user_id": 7, "username": "robert", "epoch": 0},
            {"user_id": 7, "username": "robert", "epoch": 0},
            {"user_id": 7, "username": "robert", "epoch": 1},
            {"user_id": 7, "epoch": 1},
        ]
        waits = [
            arrived[headers["webhook-id"]] - at
            for (headers, _), at in zip(receiver.requests[1:], made, strict=True)
        ]
        assert max(waits) <= 2.0, waits
    finally:
        receiver.close()


def test_a_receiver_down_for_5_s_gets_every_missed_event_once_it_is_back(
    env, admin_store, store_url, tmp_path
):
    port = free_port()
    receiver = None
    try:
        add_webhook(
            store_url, f"http://127.0.0.1:{port}/hook", ["player.created", "player.renamed"], SECRET
        )
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, port, log)
            try:
                down = time.monotonic()
                for user_id in (1, 2, 3):
                    factories.add_player(admin_store, user_id, f"p{user_id}")
                factories.rename_player(admin_store, 1, "p1-b")
                until(
                    lambda: (
                        store_sql(store_url, "SELECT count(*) FROM deliveries WHERE attempts > 0")[
                            0
                        ][0]
                        == 3
                    ),
                    "a refused first attempt for each player",
                    10,
                )
                time.sleep(max(0.0, 5.0 - (time.monotonic() - down)))
                receiver = Receiver(port=port)
                until(lambda: len(receiver.requests) == 4, "the missed events", 30)
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        got = [(b["data"]["user_id"], b["type"], b["data"]["username"]) for b in receiver.bodies()]
        assert sorted(got) == [
            (1, "player.created", "p1"),
            (1, "player.renamed", "p1-b"),
            (2, "player.created", "p2"),
            (3, "player.created", "p3"),
        ]
        assert [g for g in got if g[0] == 1] == [
            (1, "player.created", "p1"),
            (1, "player.renamed", "p1-b"),
        ]
        assert store_sql(
            store_url, "SELECT count(*) FROM deliveries WHERE state = 'delivered'"
        ) == [(4,)]
    finally:
        if receiver is not None:
            receiver.close()


@pytest.mark.slow
def test_a_deliverer_killed_mid_run_loses_no_event_and_keeps_each_player_s_order(
    env, admin_store, store_url, tmp_path
):
    def slowly(headers, body):
        time.sleep(0.005)
        return 200

    receiver = Receiver(slowly)
    processes = []
    log_path = tmp_path / "deliver.log"
    try:
        add_webhook(store_url, receiver.url(), ["player.created", "player.renamed"], SECRET)
        factories.import_players(admin_store, [(i, f"p{i}") for i in range(1, PLAYERS + 1)])
        for n in range(1, RENAMES + 1):
            factories.rename_player(admin_store, 1, f"p1-{n}")
        total = PLAYERS + RENAMES
        with open(log_path, "ab") as log:
            processes.append(start(env, receiver.port, log))
            until(lambda: len(receiver.requests) >= 60, "the first deliveries")
            processes[0].send_signal(signal.SIGKILL)
            processes[0].wait(10)
            assert len(receiver.requests) < total, "the kill came too late to test anything"
            processes.append(start(env, receiver.port, log))
            until(
                lambda: (
                    store_sql(
                        store_url, "SELECT count(*) FROM deliveries WHERE state = 'delivered'"
                    )[0][0]
                    == total
                ),
                "every delivery marked delivered",
            )
            processes[1].send_signal(signal.SIGTERM)
            assert processes[1].wait(30) == 0
        received = receiver.bodies()
        assert {(b["type"], b["data"]["user_id"], b["data"]["username"]) for b in received} == (
            {("player.created", i, f"p{i}") for i in range(1, PLAYERS + 1)}
            | {("player.renamed", 1, f"p1-{n}") for n in range(1, RENAMES + 1)}
        )
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


def test_a_failing_receiver_is_logged_without_the_secret_or_the_url_s_query(
    env, admin_store, store_url, tmp_path
):
    receiver = Receiver(lambda headers, body: 500)
    log_path = tmp_path / "deliver.log"
    try:
        add_webhook(store_url, receiver.url("/hook?token=" + SECRET), ["player.created"], SECRET)
        factories.add_player(admin_store, 7, "bob")
        with open(log_path, "ab") as log:
            process = start(env, receiver.port, log)
            try:
                until(
                    lambda: store_sql(store_url, "SELECT attempts FROM deliveries") == [(1,)],
                    "the first attempt",
                )
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        log_text = log_path.read_text()
        assert f"webhook 1: 127.0.0.1:{receiver.port} answered 500" in log_text
        assert SECRET.removeprefix("whsec_") not in log_text and "token=" not in log_text
        assert store_sql(store_url, "SELECT last_error FROM deliveries") == [
            ("answered 500",)
        ]  # the host: the log's
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
        factories.add_player(admin_store, 7, "bob")
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


CHAINED = 12  # players, each with a chain of events queued behind a slow receiver
RENAMED = 8  # renames each


def names_of(user_id: int) -> list[str]:
    """Every name a player of the deletion test has: none is a part of another's."""
    return [f"u{user_id:02d}n{k:02d}x" for k in range(RENAMED + 1)]


def test_no_post_that_arrives_after_a_deletion_s_answer_carries_the_deleted_player_s_names(
    env, admin_store, store_url, tmp_path
):
    """The receiver holds every POST while the gate is shut: once the deliverer's threads all wait
    in
    held POSTs (nothing new arrives for a second), nothing else is in flight. Then players are
    deleted, among them those whose chains are under way, and the gate opens: whatever arrives after
    a deletion's answer started after it committed, so it must carry none of that player's names,
    however long it was queued (a head waiting for a thread) or chained (read ahead behind the one
    held)."""
    gate = threading.Event()
    arrivals: list[tuple[float, bytes]] = []
    held: set[int] = set()
    lock = threading.Lock()

    def hold(headers, body):
        with lock:
            arrivals.append((time.monotonic(), body))
            user_id = json.loads(body)["data"]["user_id"]
            held.add(user_id)
        gate.wait(60)
        time.sleep(0.02)
        with lock:
            held.discard(user_id)
        return 204

    receiver = Receiver(hold)
    answered: dict[int, float] = {}  # user_id -> when its deletion was answered
    try:
        add_webhook(
            store_url,
            receiver.url(),
            ["player.created", "player.renamed", "player.deleted"],
            SECRET,
        )
        for user_id in range(1, CHAINED + 1):
            factories.add_player(admin_store, user_id, names_of(user_id)[0])
        for k in range(1, RENAMED + 1):
            for user_id in range(1, CHAINED + 1):
                factories.rename_player(admin_store, user_id, names_of(user_id)[k])
        gate.set()
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, receiver.port, log, AUTHSVC_WEBHOOK_TIMEOUT="60")
            try:

                def drained():
                    return store_sql(
                        store_url, "SELECT count(*) FROM deliveries WHERE state = 'pending'"
                    ) == [(0,)]

                until(lambda: fan_out_done(store_url), "the events fanned out")
                left = list(range(1, CHAINED + 1))
                rounds = 0
                while left:
                    rounds += not drained()
                    gate.clear()
                    until(
                        lambda: (held and time.monotonic() - arrivals[-1][0] > 1.0) or drained(),
                        "the deliverer's POSTs held",
                    )
                    with lock:
                        under_way = sorted(held)
                    # the players whose POSTs are held (their chains read past them) and one not
                    # started
                    doomed = [u for u in left if u in under_way] + [
                        u for u in reversed(left) if u not in under_way
                    ][:1]
                    for user_id in doomed:
                        factories.delete_player(admin_store, user_id)
                        answered[user_id] = time.monotonic()
                        left.remove(user_id)
                    seen = len(arrivals)
                    gate.set()
                    until(
                        lambda seen=seen: len(arrivals) >= seen + 6 or drained(), "the next POSTs"
                    )
                until(lambda: fan_out_done(store_url) and drained(), "every delivery taken")
                assert rounds > 1, "the deliveries went before the deletions could test anything"
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                gate.set()
                if process.poll() is None:
                    process.kill()
        late = [
            (user_id, round(at - answered[user_id], 3), body.decode())
            for at, body in arrivals
            for user_id in answered
            if at > answered[user_id] and any(name.encode() in body for name in names_of(user_id))
        ]
        assert late == [], (
            f"{len(late)} POSTs after a deletion's answer carried a deleted name, first: {late[:3]}"
        )
        # the deletions came while chains were under way: each player's deletion event arrived, last
        deleted = [
            json.loads(body)["data"]["user_id"]
            for _, body in arrivals
            if b'"player.deleted"' in body
        ]
        assert sorted(deleted) == list(range(1, CHAINED + 1))
    finally:
        gate.set()
        receiver.close()


def fan_out_done(store_url: str) -> bool:
    return store_sql(
        store_url, "SELECT min(fanned_out) = max(e.id) FROM webhooks, events AS e"
    ) in ([(True,)], [(1,)])


class Blackhole:
    """A listener on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_blackholed_webhook_with_1000_players_pending_holds_up_no_other_webhook(
    env, admin_store, store_url, tmp_path
):
    blackhole = Blackhole()
    arrived: dict[str, float] = {}

    def note(headers, body):
        arrived[json.loads(body)["data"]["username"]] = time.monotonic()
        return 204

    healthy = Receiver(note)
    try:
        stuck = add_webhook(
            store_url, f"http://127.0.0.1:{blackhole.port}/hook", ["player.created"], SECRET
        )
        factories.import_players(admin_store, [(i, f"p{i}") for i in range(1, 1001)])
        add_webhook(store_url, healthy.url(), ["player.renamed"], SECRET)
        with open(tmp_path / "deliver.log", "ab") as log:
            process = start(env, blackhole.port, log, healthy.port)
            try:
                until(lambda: len(blackhole.accepted) >= 2, "the blackholed webhook's first POSTs")
                waits = []
                for n in range(1, 11):
                    made = time.monotonic()
                    factories.rename_player(admin_store, n, f"renamed{n}")
                    until(
                        lambda n=n: f"renamed{n}" in arrived, f"the healthy webhook's event {n}", 30
                    )
                    waits.append(round(arrived[f"renamed{n}"] - made, 3))
                pending = store_sql(
                    store_url,
                    "SELECT count(*) FROM deliveries WHERE webhook_id = ? AND state = 'pending'",
                    (stuck,),
                )[0][0]
                blackhole.close()
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0
            finally:
                if process.poll() is None:
                    process.kill()
        assert pending >= 990, pending  # the blackholed webhook's backlog stood meanwhile
        assert max(waits) <= 2.0, (
            waits
        )  # 0.1 s on an idle machine; each one at most twice the promise of 1 s
    finally:
        blackhole.close()
        healthy.close()
