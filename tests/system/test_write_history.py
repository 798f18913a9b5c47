"""The history test: admin writes under kills and restarts, then the audit trail read back as their
history.

What it proves, from outside: each admin write — the change, its audit record and, for a POST with
an ``Idempotency-Key``, the kept answer to replay — is one transaction (docs/admin-api.md, "Retries
and Idempotency-Key"; docs/admin.md, "The audit trail"). Nothing here looks inside the service: real
gunicorn (4 sync workers) serves the admin API on loopback, the real ``authsvc`` command runs beside
it, on a real store (a SQLite file, or a PostgreSQL cluster of the test's own), and the history is
read back from the store at the end.

The load (LOAD_SECONDS): API writers, each with its own API token, revoke, mint, batch-write and
PUT players (with and without ``If-Match``); pairs of signups PUT the same new user id at the same
moment; command writers run ``authsvc player revoke``, ``player rename`` and ``token issue``. Every
POST carries an ``Idempotency-Key``; a request that fails (no answer, a 5xx, 429, 409
idempotency-key-running) is sent again, the same request with the same key, within a bounded budget
(OP_ATTEMPTS tries, OP_BUDGET seconds). Meanwhile: kill -9 of a random worker every 0.2-0.5 s; kill
-9 of the gunicorn master three times (a new one is started on the same port at once, with
--reuse-port: the orphaned workers finish what they hold); on PostgreSQL, kill -9 of the postmaster
twice (on a cluster of the test's own, restarted after a second; its database commits synchronously,
see postgres_database). A master that stops by itself is started again, as systemd would (a worker
that boots while PostgreSQL is down stops gunicorn: "App failed to load"); the summary counts it.

After the load, the late retries: a key still unanswered (409 "running": its request died with a
worker) is sent again once the service's documented abandonment time has passed (60 s after its
first request; that wait, most of a run on today's code, happens only when such a key exists), and a
sample of acknowledged keys (those retried during the load first) is sent again: each must be
answered as a replay of its first answer.

How a record is tied to the write that made it, exactly (no guessing from counts): every API attempt
sends its own ``X-Request-Id``, ``<write>.<attempt>``; each audit record keeps it beside the
server's own request id, as ``client_request_id``. The ``Idempotency-Key`` is the write's id itself,
under the writer's own API token. Each command run has ``SUDO_USER=<write>``, so its record's actor
is ``cli:<write>``. Every name written (PUT, batch item, rename) is one never used before, so an
acknowledged write must have changed the store at one of its attempts: it has exactly one record.
(A PUT carries no key: when another write to the same player lands between two of its attempts, the
retry rightly writes again; that case is told apart by the records in between.)

The checks, each failure with its figures:
  (a) no acknowledged write is lost: each 2xx write (and each command that exited 0) has its record,
      and no acknowledged revoke's epoch is above the player's final epoch;
  (b) no Idempotency-Key has a second effect, also after the late retries: at most one record per
  key;
      the epoch increments equal the revoke writes that took effect; a late replay answers the first
      answer again (``Idempotent-Replayed``, the same epoch, the same token);
  (c) no mint of a revoked epoch: along the chain, each token.mint record's epoch is the player's
  epoch
      at that point (so no answered token was dead when it was answered);
  (d) audit time (at_ms) never goes backwards along the chain;
  (e) ``authsvc audit verify`` exits 0;
  (f) no duplicate: no write has more than one record of its change (nor one attempt two);
  (g) no 500: an opaque "internal" answer is a bug (docs/admin-api.md, "Errors");
  (h) no key is answered "running" for longer than RUNNING_LIMIT seconds, and every write is
  answered
      within its retry budget.
The run also checks itself (enough writes acknowledged, the faults really injected), so a quiet run
cannot pass. Secrets (API tokens, minted tokens, the game's api key) are never printed: a minted
token is compared by a digest. After a run, the test's tmp_path holds history.json (every write, its
attempts and answers, and every audit record) and the gunicorn logs, to read a failure by hand.

Marked ``slow``, the suite's marker for tests on real servers (``-m "not slow"`` leaves it out).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from authsvc.operations import api_tokens, games
from authsvc.operations import players as players_ops
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from tests.support import admin_request, free_port, start_gunicorn, store_sql, wait_for_port

pytestmark = pytest.mark.slow

LOAD_SECONDS = 20.0
WORKERS = 4
PLAYERS = tuple(range(1001, 1021))  # existing players: revoked, minted for, renamed, batch-written
SIGNUP_IDS = tuple(range(2001, 2401))  # not yet created: PUT by two signups at once
BATCH_NEW_FIRST = 3001  # each batch also creates one new player, from here up
API_WRITERS = 6
SIGNUP_PAIRS = 2
CLI_WRITERS = 2
SCOPES = ["players:read", "players:write", "tokens:mint"]
REQUEST_TIMEOUT = 10.0
OP_ATTEMPTS, OP_BUDGET = 60, 12.0  # a client's bound on one write's retries
OPS_PER_WRITER = 5000
CLI_TIMEOUT = 40.0
MASTER_KILLS_AT = (0.25, 0.5, 0.75)  # shares of the load
POSTMASTER_KILLS_AT = (0.35, 0.7)
ABANDONED_AFTER = (
    61.0  # docs/admin-api.md: "a retry after 60 seconds runs again"; one second of margin
)
RUNNING_LIMIT = 5.0
LATE_REPLAYS, LATE_SECONDS = 300, 20.0
CHANGES = {  # the audit actions each kind of write makes
    "revoke": {"player.revoke"},
    "mint": {"token.mint"},
    "batch": {"player.batch"},
    "put": {"player.add", "player.rename"},
    "put-if-match": {"player.rename"},
    "signup": {"player.add", "player.rename"},
    "cli-revoke": {"player.revoke"},
    "cli-rename": {"player.rename"},
    "cli-mint": {"token.mint"},
}
KEYED = {"revoke", "mint", "batch"}
PUTS = {"put", "put-if-match", "signup"}


# -- writes and their attempts ---------------------------------------------------------------------


@dataclasses.dataclass
class Answer:
    status: int | None  # None: no answer (refused, reset, timed out)
    headers: dict
    obj: dict | None
    error: str | None = None

    @property
    def problem(self) -> str:
        return str((self.obj or {}).get("type", "")).rpartition(":")[2]

    def transient(self) -> bool:
        """What a client retries with the same key: no answer, a 5xx, 429, or the key still
        running."""
        if self.status is None or self.status >= 500 or self.status == 429:
            return True
        return self.status == 409 and self.problem == "idempotency-key-running"


@dataclasses.dataclass
class Attempt:
    rid: str
    t0: float
    t1: float
    status: int | None
    problem: str
    replayed: bool


@dataclasses.dataclass
class Op:
    """One logical API write: the same request (and key) on every attempt."""

    id: str
    kind: str
    token: str = dataclasses.field(repr=False)
    method: str = "POST"
    path: str = ""
    body: dict | None = None
    user_id: int | None = None
    headers: dict = dataclasses.field(default_factory=dict)
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    replays: list[Attempt] = dataclasses.field(default_factory=list)
    status: int | None = None  # the definitive answer's
    answer: dict = dataclasses.field(default_factory=dict)  # without a minted token
    token_digest: str | None = None
    replay_answer: dict | None = None
    replay_digest: str | None = None
    started: float = dataclasses.field(default_factory=time.time)

    @property
    def acked(self) -> bool:
        return self.status in (200, 201)


@dataclasses.dataclass
class CliRun:
    id: str
    kind: str
    user_id: int
    rc: int | None = None
    epoch: int | None = None
    error: str = ""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def send(port: int, op: Op, rid: str) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        headers = (
            op.headers
            | {"X-Request-Id": rid}
            | ({"Idempotency-Key": op.id} if op.kind in KEYED else {})
        )
        response = admin_request(conn, op.method, op.path, op.token, op.body, headers)
        raw = response.read()
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, obj)
    except (OSError, http.client.HTTPException) as e:
        return Answer(None, {}, None, type(e).__name__)
    finally:
        conn.close()


def pause(answer: Answer, rng: random.Random) -> float:
    after = answer.headers.get("retry-after", "")
    return max(min(int(after), 1) if after.isdigit() else 0, rng.uniform(0.05, 0.2))


def exchange(
    port: int, op: Op, log: list[Attempt], tag: str, rng: random.Random, budget: float = OP_BUDGET
) -> Answer | None:
    """The request until a definitive answer (None: none within the budget), each attempt logged."""
    start = time.monotonic()
    for n in range(OP_ATTEMPTS):
        t0 = time.monotonic()
        answer = send(port, op, f"{op.id}.{tag}{n}")
        log.append(
            Attempt(
                f"{op.id}.{tag}{n}",
                t0,
                time.monotonic(),
                answer.status,
                answer.problem or answer.error or "",
                answer.headers.get("idempotent-replayed") == "true",
            )
        )
        if not answer.transient():
            return answer
        wait = pause(answer, rng)
        if time.monotonic() + wait - start > budget:
            return None
        time.sleep(wait)
    return None


def settle(op: Op, answer: Answer | None) -> None:
    """Keep the definitive answer, the minted token as a digest only."""
    if answer is None:
        return
    obj = dict(answer.obj or {})
    token = obj.pop("game_auth_token", None)
    op.status, op.answer, op.token_digest = answer.status, obj, digest(token) if token else None


# -- the service, its faults
# ------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a gunicorn master's workers)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(name))
    return found


class AdminService:
    """The admin API under gunicorn on one port; a master killed is replaced at once (--reuse-port:
    the orphaned workers of the old one still hold their socket while they finish)."""

    def __init__(self, env: dict, port: int, log_dir: Path):
        self.env, self.port, self.log_dir = env, port, log_dir
        self.masters: list[subprocess.Popen] = []
        self.tally: collections.Counter = collections.Counter()

    def start(self) -> None:
        with (self.log_dir / f"admin-{len(self.masters)}.log").open("wb") as log:
            self.masters.append(
                start_gunicorn(
                    self.env,
                    "--reuse-port",
                    port=self.port,
                    app="authsvc.api.wsgi:application",
                    workers=WORKERS,
                    new_session=True,
                    stdout=log,
                    stderr=log,
                )
            )

    def kill_worker(self, rng: random.Random) -> None:
        workers = children(self.masters[-1].pid)
        if workers:
            try:
                os.kill(rng.choice(workers), signal.SIGKILL)
                self.tally["worker kills"] += 1
            except ProcessLookupError:
                pass

    def kill_master(self) -> None:
        self.masters[-1].kill()
        self.masters[-1].wait(10)
        self.tally["master kills"] += 1
        self.start()

    def supervise(self) -> None:
        """A master that stopped by itself (a worker could not boot: the store was down) is started
        again."""
        if self.masters[-1].poll() is not None and len(self.masters) < 40:
            self.tally["master stopped by itself"] += 1
            self.start()

    def stop(self) -> None:
        for proc in self.masters:  # each master's group holds its orphaned workers, if any
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.masters[-1].wait(30)
        except subprocess.TimeoutExpired:
            pass
        for proc in self.masters:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)


def crash_postgres(own_pg, tally: collections.Counter) -> None:
    """kill -9 of the postmaster, a second of outage, then a restart (its orphaned backends must go
    first)."""
    os.kill(own_pg.postmaster_pid(), signal.SIGKILL)
    tally["postmaster kills"] += 1
    time.sleep(1.0)
    deadline = time.monotonic() + 30
    for _ in range(60):
        try:
            own_pg.start()
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def inject_faults(admin: AdminService, own_pg, load_end: float, rng: random.Random) -> None:
    start = time.monotonic()
    master_at = [start + LOAD_SECONDS * share for share in MASTER_KILLS_AT]
    postmaster_at = (
        [start + LOAD_SECONDS * share for share in POSTMASTER_KILLS_AT] if own_pg else []
    )
    next_worker_kill = start + rng.uniform(0.2, 0.5)
    for _ in range(int(LOAD_SECONDS * 100)):
        now = time.monotonic()
        if now >= load_end:
            return
        admin.supervise()
        if postmaster_at and now >= postmaster_at[0]:
            postmaster_at.pop(0)
            crash_postgres(own_pg, admin.tally)
        elif master_at and now >= master_at[0]:
            master_at.pop(0)
            admin.kill_master()
        elif now >= next_worker_kill:
            admin.kill_worker(rng)
            next_worker_kill = now + rng.uniform(0.2, 0.5)
        time.sleep(0.01)


# -- the writers
# ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Load:
    port: int
    tokens: dict = dataclasses.field(repr=False)
    game_id: int
    cli_env: dict
    load_end: float
    ops: list[Op] = dataclasses.field(default_factory=list)
    cli: list[CliRun] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    signups: list[int] = dataclasses.field(default_factory=lambda: list(SIGNUP_IDS))
    next_new: int = BATCH_NEW_FIRST

    def take(self, what: str) -> int | None:
        with self.lock:
            if what == "signup":
                return self.signups.pop(0) if self.signups else None
            self.next_new += 1
            return self.next_new - 1


def etag_of(load: Load, name: str, user_id: int, rng: random.Random) -> str | None:
    read = Op(f"{name}-get", "get", load.tokens[name], "GET", f"/v1/players/{user_id}")
    answer = exchange(load.port, read, [], "", rng, budget=5.0)
    return answer.headers.get("etag") if answer is not None and answer.status == 200 else None


def new_op(load: Load, name: str, seq: int, rng: random.Random) -> Op | None:
    kind = rng.choices(["revoke", "mint", "batch", "put", "put-if-match"], [30, 25, 10, 15, 20])[0]
    op = Op(f"{name}-{seq:04d}-{kind[:2]}", kind, load.tokens[name], user_id=rng.choice(PLAYERS))
    if kind == "revoke":
        op.path = f"/v1/players/{op.user_id}/revoke"
    elif kind == "mint":
        op.path, op.body = "/v1/tokens", {"game_id": load.game_id, "user_id": op.user_id}
    elif kind == "batch":
        ids = sorted(rng.sample(PLAYERS, 3)) + [load.take("batch")]
        op.path, op.body = (
            "/v1/players/batch",
            {"players": [{"user_id": i, "username": f"b-{op.id}-{i}"} for i in ids]},
        )
    else:
        op.method, op.path, op.body = "PUT", f"/v1/players/{op.user_id}", {"username": f"n-{op.id}"}
        if kind == "put-if-match":
            tag = etag_of(load, name, op.user_id, rng)
            if tag is None:
                return None
            op.headers = {"If-Match": tag}
    return op


def api_writer(load: Load, name: str, seed: int) -> None:
    rng = random.Random(seed)
    for seq in range(OPS_PER_WRITER):
        if time.monotonic() >= load.load_end:
            return
        op = new_op(load, name, seq, rng)
        if op is not None:
            load.ops.append(op)
            settle(op, exchange(load.port, op, op.attempts, "", rng))


def signup_pair(load: Load, names: tuple[str, str], seed: int) -> None:
    """Two signups of the same new id at the same moment, each with its own name and token."""
    rng = random.Random(seed)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for seq in range(len(SIGNUP_IDS)):
            user_id = load.take("signup")
            if user_id is None or time.monotonic() >= load.load_end:
                return
            pair = [
                Op(
                    f"{name}-{seq:04d}-su",
                    "signup",
                    load.tokens[name],
                    "PUT",
                    f"/v1/players/{user_id}",
                    {"username": f"s-{name}-{seq}"},
                    user_id,
                )
                for name in names
            ]
            load.ops.extend(pair)
            list(
                pool.map(
                    lambda op: settle(
                        op, exchange(load.port, op, op.attempts, "", random.Random(rng.random()))
                    ),
                    pair,
                )
            )


def cli_writer(load: Load, name: str, seed: int) -> None:
    """The admin command beside the API: each run its own process, its own actor (SUDO_USER)."""
    rng = random.Random(seed)
    for seq in range(OPS_PER_WRITER):
        if time.monotonic() >= load.load_end:
            return
        kind = rng.choice(["revoke", "rename", "mint"])
        run = CliRun(f"{name}-{seq:04d}-{kind[:2]}", "cli-" + kind, rng.choice(PLAYERS))
        argv = {
            "revoke": ["player", "revoke", str(run.user_id)],
            "rename": ["player", "rename", str(run.user_id), f"c-{run.id}"],
            "mint": ["token", "issue", "--game", str(load.game_id), "--user", str(run.user_id)],
        }[kind]
        load.cli.append(run)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "authsvc.cli.command", *argv, "--json"],
                env=load.cli_env | {"SUDO_USER": run.id},
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            run.error = "timed out"
            continue
        run.rc = done.returncode
        if done.returncode == 0 and kind == "revoke":
            run.epoch = json.loads(done.stdout)["epoch"]
        elif done.returncode != 0:
            run.error = (done.stderr.strip().splitlines() or [""])[-1][
                :200
            ]  # an error line holds no secret


# -- after the load
# ---------------------------------------------------------------------------------


def late_retries(load: Load, rng: random.Random) -> dict:
    """Keys left unanswered are sent again once the service gives them up; then a sample of
    acknowledged keys is sent again late, each of which must be a replay of its first answer."""
    figures = collections.Counter()
    stuck = [op for op in load.ops if op.kind in KEYED and op.status is None]
    if stuck:
        wait = max(op.started for op in stuck) + ABANDONED_AFTER - time.time()
        figures["waited s"] = round(max(0.0, min(wait, ABANDONED_AFTER + 5)))
        time.sleep(max(0.0, min(wait, ABANDONED_AFTER + 5)))
        for op in stuck:
            settle(op, exchange(load.port, op, op.attempts, "L", rng))
            figures["stuck keys retried"] += 1
    acked = [op for op in load.ops if op.kind in KEYED and op.acked]
    rng.shuffle(acked)
    sample = sorted(acked, key=lambda op: len(op.attempts) == 1)[
        :LATE_REPLAYS
    ]  # those retried during the load first
    deadline = time.monotonic() + LATE_SECONDS
    for op in sample:
        if time.monotonic() > deadline:
            break
        answer = exchange(load.port, op, op.replays, "R", rng, budget=5.0)
        if answer is not None:
            obj = dict(answer.obj or {})
            token = obj.pop("game_auth_token", None)
            op.replay_answer, op.replay_digest = obj, digest(token) if token else None
        figures["late replays"] += 1
    return dict(figures)


def read_history(url: str) -> tuple[list[dict], dict[int, int]]:
    rows = store_sql(
        url, "SELECT id, at_ms, actor, request_id, action, user_id, changes FROM audit ORDER BY id"
    )
    records = [
        dict(
            zip(
                ("id", "at_ms", "actor", "request_id", "action", "user_id", "changes"),
                row,
                strict=True,
            )
        )
        for row in rows
    ]
    for record in records:
        record["changes"] = json.loads(record["changes"])
        # Each attempt's own id travels as the client's X-Request-Id, which the record keeps beside
        # the server's request id as client_request_id (docs/admin-api.md): that is what ties it to
        # a write.
        record["request_id"] = (
            record["changes"].get("after", {}).get("client_request_id") or record["request_id"]
        )
        record["write"] = (
            (record["request_id"] or "").rpartition(".")[0]
            if record["actor"].startswith("api:")
            else record["actor"].removeprefix("cli:")
        )
    epochs = dict(store_sql(url, "SELECT user_id, epoch FROM players"))
    return records, epochs


def by_write(records: list[dict], kinds: dict[str, str]) -> dict[str, list[dict]]:
    """Each write's records of the change its kind makes."""
    found: dict[str, list[dict]] = collections.defaultdict(list)
    for record in records:
        kind = kinds.get(record["write"])
        if kind is not None and record["action"] in CHANGES[kind]:
            found[record["write"]].append(record)
    return found


def keep_history(path: Path, load: Load, records: list[dict]) -> None:
    """The run as read back, for a person to look at after a failure (no token in it: answers are
    kept without)."""
    writes = [
        {
            "id": op.id,
            "kind": op.kind,
            "path": op.path,
            "body": op.body,
            "status": op.status,
            "answer": op.answer,
            "attempts": [dataclasses.asdict(a) for a in op.attempts + op.replays],
        }
        for op in load.ops
    ]
    writes += [dataclasses.asdict(run) for run in load.cli]
    path.write_text(json.dumps({"writes": writes, "records": records}, indent=1))


def count(items) -> str:
    counted = collections.Counter(items)
    return ", ".join(f"{k} {v}" for k, v in sorted(counted.items())) or "none"


# -- the checks: each returns its failure, with figures, or ""
# ------------------------------------------


def check_lost(ops_: list[Op], cli: list[CliRun], found: dict, epochs: dict) -> str:
    acked = [(op.id, op.kind) for op in ops_ if op.acked] + [
        (run.id, run.kind) for run in cli if run.rc == 0
    ]
    lost = [kind for write, kind in acked if not found.get(write)]
    answered = [
        (op.answer.get("epoch"), op.user_id) for op in ops_ if op.kind == "revoke" and op.acked
    ]
    answered += [
        (run.epoch, run.user_id) for run in cli if run.kind == "cli-revoke" and run.rc == 0
    ]
    above = sum(1 for epoch, user in answered if epoch is None or epoch > epochs.get(user, -1))
    if lost or above:
        return (
            f"(a) lost acknowledged writes: {len(lost)} of {len(acked)} acknowledged have no audit "
            f"record ({count(lost)}); acknowledged revokes whose epoch is above the player's final "
            f"epoch: {above} of {len(answered)}"
        )
    return ""


def check_second_effects(
    ops_: list[Op], cli: list[CliRun], found: dict, records: list[dict], epochs: dict
) -> str:
    keyed = [op for op in ops_ if op.kind in KEYED]
    twice = [op for op in keyed if len(found.get(op.id, ())) > 1]
    late = [
        op
        for op in twice
        if any(".L" in r["request_id"] or ".R" in r["request_id"] for r in found[op.id][1:])
    ]
    revokes = [r for r in records if r["action"] == "player.revoke"]
    took_effect_api = sum(1 for op in keyed if op.kind == "revoke" and found.get(op.id))
    took_effect_cli = sum(1 for run in cli if run.kind == "cli-revoke" and found.get(run.id))
    increments = sum(epochs.get(user, 0) for user in PLAYERS)
    extra = increments - took_effect_api - took_effect_cli
    per_player = collections.Counter(r["user_id"] for r in revokes)
    unlike = sum(1 for user in PLAYERS if per_player[user] != epochs.get(user))
    replayed = [op for op in keyed if op.replays]
    differ = [
        op
        for op in replayed
        if op.replay_answer is None
        or not op.replays[-1].replayed
        or op.replay_answer != op.answer
        or op.replay_digest != op.token_digest
    ]
    if twice or extra or differ or unlike:
        return (
            f"(b) Idempotency-Keys with a second effect: {len(twice)} of {len(keyed)} "
            f"({count(op.kind for op in twice)}); {len(late)} of them from a late retry; epoch "
            f"increments {increments} (player.revoke records {len(revokes)}; players whose epoch "
            f"is not their count of revoke records: {unlike}) for "
            f"{took_effect_api + took_effect_cli} revoke writes that took effect "
            f"({took_effect_api} API keys, {took_effect_cli} commands): {extra} extra; late "
            f"replays not answered as a replay of the first answer: {len(differ)} of "
            f"{len(replayed)} ({count(op.kind for op in differ)})"
        )
    return ""


def check_mint_epochs(ops_: list[Op], cli: list[CliRun], found: dict, records: list[dict]) -> str:
    acknowledged = {op.id for op in ops_ if op.acked} | {run.id for run in cli if run.rc == 0}
    epoch: dict[int, int] = collections.defaultdict(int)
    behind, answered_dead = 0, 0
    for record in records:
        if record["action"] == "player.revoke":
            epoch[record["user_id"]] = record["changes"]["after"]["epoch"]
        elif (
            record["action"] == "token.mint"
            and record["changes"]["after"]["epoch"] != epoch[record["user_id"]]
        ):
            behind += 1
            answered_dead += record["write"] in acknowledged
    mints = [op for op in ops_ if op.kind == "mint" and op.acked and found.get(op.id)]
    mismatched = sum(
        1
        for op in mints
        if op.answer.get("epoch") not in {r["changes"]["after"]["epoch"] for r in found[op.id]}
    )
    total = sum(1 for r in records if r["action"] == "token.mint")
    if behind or mismatched:
        return (
            f"(c) mints of a revoked epoch: {behind} of {total} token.mint records carry an epoch "
            f"a revoke earlier in the chain had already ended, {answered_dead} of them answered to "
            "a client as a token; API mint answers whose epoch is in none of their records: "
            f"{mismatched} of {len(mints)}"
        )
    return ""


def check_time_order(records: list[dict]) -> str:
    steps = [prev["at_ms"] - rec["at_ms"] for prev, rec in zip(records, records[1:], strict=False)]
    back = [step for step in steps if step > 0]
    if back:
        return (
            f"(d) audit time runs backwards along the chain: {len(back)} of {len(steps)} steps, "
            f"by up to {max(back)} ms"
        )
    return ""


def check_verify(rc: int, out: str) -> str:
    if rc != 0:
        return f"(e) authsvc audit verify exited {rc}: {out.strip()[:300]}"
    return ""


def check_duplicates(ops_: list[Op], cli: list[CliRun], found: dict, records: list[dict]) -> str:
    kinds = {op.id: op.kind for op in ops_} | {run.id: run.kind for run in cli}
    dupes = []
    for write, own in found.items():
        if len(own) < 2:
            continue
        if (
            kinds[write] in PUTS
        ):  # a retried PUT may rightly write again after another write to the player
            between = [
                r
                for r in records
                if own[0]["id"] < r["id"] < own[-1]["id"]
                and r["user_id"] == own[0]["user_id"]
                and r["write"] != write
            ]
            if between:
                continue
        dupes.append(kinds[write])
    per_attempt = collections.Counter(
        (r["request_id"], r["action"]) for r in records if r["request_id"]
    )
    twice_in_one = sum(1 for n in per_attempt.values() if n > 1)
    if dupes or twice_in_one:
        return (
            f"(f) writes with more than one record of their change: {len(dupes)} ({count(dupes)}); "
            f"single requests with two records of one action: {twice_in_one}"
        )
    return ""


def check_internal_errors(ops_: list[Op]) -> str:
    errors = [op.kind for op in ops_ for a in op.attempts + op.replays if a.status == 500]
    if errors:
        return (
            f"(g) 500 answers: {len(errors)} of {sum(len(op.attempts) for op in ops_)} "
            f"attempts ({count(errors)})"
        )
    return ""


def running_span(attempts: list[Attempt]) -> float:
    """Seconds from the first to the last 409 idempotency-key-running answer a write got during the
    load."""
    running = [
        a
        for a in attempts
        if a.problem == "idempotency-key-running" and a.rid.rpartition(".")[2].isdigit()
    ]
    return running[-1].t1 - running[0].t0 if running else 0.0


def check_running(ops_: list[Op], unanswered: list[str]) -> str:
    streaks = [(running_span(op.attempts), op.kind) for op in ops_ if op.kind in KEYED]
    long = [(s, kind) for s, kind in streaks if s > RUNNING_LIMIT]
    longest = max((s for s, _ in streaks), default=0.0)
    if long or unanswered:
        return (
            f"(h) keys answered 409 running for more than {RUNNING_LIMIT:g} s: {len(long)} "
            f"({count(kind for _, kind in long)}), the longest {longest:.1f} s; writes with no "
            f"definitive answer within their budget ({OP_BUDGET:g} s): {len(unanswered)} "
            f"({count(unanswered)})"
        )
    return ""


# -- the test
# ---------------------------------------------------------------------------------------


def postgres_database(own_pg) -> str:
    """A database on the test's own cluster. Its commits are synchronous (the throwaway cluster runs
    with synchronous_commit=off, under which a killed postmaster may lose a commit it acknowledged:
    that is the cluster's setting, not the service's fault); a database setting overrides the
    server's."""
    store_sql(own_pg.url, "CREATE DATABASE authsvc")
    store_sql(own_pg.url, "ALTER DATABASE authsvc SET synchronous_commit = on")
    return own_pg.url.rpartition("/")[0] + "/authsvc"


def provision(env: dict, token_names: list[str]) -> tuple[int, dict]:
    """The store: one game, the PLAYERS, an API token per writer (the setup's records: actor
    cli:setup)."""
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    try:
        store.migrate()
        ctx = Context(actor="cli:setup")
        game, _ = games.add_game(store, ctx, "Chess")
        for user_id in PLAYERS:
            players_ops.add_player(store, ctx, user_id, f"p{user_id}")
        tokens = {
            name: api_tokens.add_api_token(store, ctx, name, SCOPES)[1] for name in token_names
        }
    finally:
        store.close()
    return game.id, tokens


def until_answering(port: int, token: str, admin: AdminService) -> None:
    probe = Op("probe", "get", token, "GET", f"/v1/players/{PLAYERS[0]}")
    for n in range(300):
        admin.supervise()
        if send(port, probe, f"probe.{n}").status == 200:
            return
        time.sleep(0.1)
    raise AssertionError(
        "the admin API did not answer within 30 s (logs: admin-*.log in the test's tmp_path)"
    )


def test_write_history(store_url, secret_file, tmp_path, request):
    started = time.monotonic()
    own_pg = None
    if not store_url.startswith("sqlite://"):  # a cluster of its own: its postmaster is killed
        own_pg = request.getfixturevalue("own_pg")
        store_url = postgres_database(own_pg)
    env = {
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
        "AUTHSVC_PG_CONNECT_TIMEOUT": "2",
    }
    api_names = [f"w{i}" for i in range(API_WRITERS)]
    pair_names = [(f"s{i}a", f"s{i}b") for i in range(SIGNUP_PAIRS)]
    game_id, tokens = provision(env, api_names + [name for pair in pair_names for name in pair])
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    port = free_port()
    admin = AdminService(env, port, tmp_path)
    admin.start()
    try:
        wait_for_port(port)
        until_answering(port, tokens["w0"], admin)
        load_started = time.monotonic()
        cli_env = {k: v for k, v in os.environ.items() if k != "AUTHSVC_CONFIG"} | env
        load = Load(port, tokens, game_id, cli_env, load_started + LOAD_SECONDS)
        threads = [
            threading.Thread(target=api_writer, args=(load, name, rng.random()), daemon=True)
            for name in api_names
        ]
        threads += [
            threading.Thread(target=signup_pair, args=(load, pair, rng.random()), daemon=True)
            for pair in pair_names
        ]
        threads += [
            threading.Thread(target=cli_writer, args=(load, f"c{i}", rng.random()), daemon=True)
            for i in range(CLI_WRITERS)
        ]
        for thread in threads:
            thread.start()
        inject_faults(admin, own_pg, load.load_end, random.Random(rng.random()))
        for thread in threads:
            thread.join(
                max(
                    1.0,
                    load.load_end
                    + OP_BUDGET
                    + 2 * REQUEST_TIMEOUT
                    + CLI_TIMEOUT
                    - time.monotonic(),
                )
            )
        assert not any(thread.is_alive() for thread in threads), (
            "a writer did not stop within its bounds"
        )
        load_seconds = time.monotonic() - load_started
        until_answering(port, tokens["w0"], admin)
        unanswered = [op.kind for op in load.ops if op.status is None]
        late = late_retries(load, random.Random(rng.random()))
    finally:
        admin.stop()
    records, epochs = read_history(store_url)
    verify = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", "audit", "verify", "--json"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    kinds = {op.id: op.kind for op in load.ops} | {run.id: run.kind for run in load.cli}
    found = by_write(records, kinds)
    keep_history(tmp_path / "history.json", load, records)
    known = set(kinds) | {"setup"}
    strangers = [r["id"] for r in records if r["write"] not in known]

    attempts = [a for op in load.ops for a in op.attempts]
    summary = (
        f"{request.node.name}: seed {seed}; load {LOAD_SECONDS:g} s and its retries "
        f"{load_seconds:.1f} s, whole run {time.monotonic() - started:.0f} s; API writes "
        f"{len(load.ops)} ({count(op.kind for op in load.ops)}), acknowledged "
        f"{sum(op.acked for op in load.ops)}; attempts {len(attempts)}: "
        f"{count(str(a.status) if a.status else 'no answer' for a in attempts)}; commands "
        f"{len(load.cli)} (exit {count(str(run.rc) for run in load.cli)}); faults: "
        f"{count(admin.tally.elements())}; late: {late}; audit records {len(records)}"
    )
    print(summary)
    harness = []
    if sum(op.acked for op in load.ops) < 100 or sum(run.rc == 0 for run in load.cli) < 5:
        harness.append("the load was too small to say anything")
    if admin.tally["worker kills"] < 20 or admin.tally["master kills"] < len(MASTER_KILLS_AT):
        harness.append("the gunicorn faults were not all injected")
    if own_pg is not None and admin.tally["postmaster kills"] < len(POSTMASTER_KILLS_AT):
        harness.append("the postmaster was not killed")
    if strangers:
        harness.append(
            f"{len(strangers)} audit records belong to no write of this test (first ids "
            f"{strangers[:5]})"
        )
    assert not harness, "harness: " + "; ".join(harness) + "\n" + summary

    failures = [
        check_lost(load.ops, load.cli, found, epochs),
        check_second_effects(load.ops, load.cli, found, records, epochs),
        check_mint_epochs(load.ops, load.cli, found, records),
        check_time_order(records),
        check_verify(verify.returncode, verify.stdout or verify.stderr),
        check_duplicates(load.ops, load.cli, found, records),
        check_internal_errors(load.ops),
        check_running(load.ops, unanswered),
    ]
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures) + "\n" + summary
