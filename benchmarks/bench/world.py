"""The data every section measures: a SQLite store of N players, its secret, valid requests;
in-process timing."""

from __future__ import annotations

import argparse
import dataclasses
import io
import random
import statistics
import sys
import time
import wsgiref.util
from collections.abc import Callable
from pathlib import Path

from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key, new_token_secret
from authsvc.web.app import App, make_app

REPO = Path(__file__).resolve().parents[2]

PATH = "/api/authenticate.json"

# The shipped settings file (access_record = "edge": behind nginx, nginx's access line is a
# request's one record, gunicorn's access log and the app's auth line off). Every section that runs
# the shipped path (deploy/gunicorn.conf.py behind the shipped nginx site) starts gunicorn with it,
# as the unit does; the environment (the store, the secret, the workers) beats the file.
SHIPPED_SETTINGS = REPO / "deploy" / "etc" / "authsvc.toml"
SHIPPED_ENV = {"AUTHSVC_CONFIG": str(SHIPPED_SETTINGS)}

VENV_BIN = Path(sys.executable).parent

APPS = {
    "bare": "benchmarks.bare:application",
    "plain": "benchmarks.plain_app:application",
    "authsvc": "authsvc.wsgi:application",
    "flask": "benchmarks.flask_app:application",
}

SAMPLE = 1000  # distinct players in the request mix

SCALE_SAMPLE = 20_000  # the scale section's: more leaf pages than SQLite's page cache holds


@dataclasses.dataclass
class World:
    """A store with one game and N players, the secret, and a sample of valid requests."""

    root: Path
    store_url: str
    secret_file: Path
    api_key: str
    game_id: int
    players: int
    user_ids: list[int]
    secret: bytes

    @property
    def env(self) -> dict[str, str]:
        return {"AUTHSVC_STORE": self.store_url, "AUTHSVC_TOKEN_SECRET_FILE": str(self.secret_file)}

    def query(self, user_id: int, **overrides) -> str:
        params = {
            "user_id": str(user_id),
            "game_auth_token": mint_token(self.secret, self.game_id, user_id, 0),
            "api_key": self.api_key,
        }
        params.update(overrides)
        return "&".join(f"{k}={v}" for k, v in params.items() if v is not None)

    def paths(self) -> list[str]:
        return [f"{PATH}?{self.query(uid)}" for uid in self.user_ids]


def username(user_id: int) -> str:
    return f"player{user_id}"


def make_world(root: Path, players: int, seed: int = 1) -> World:
    """A fresh SQLite store of ``players`` players (user ids 1..N) and one game; timed in the
    output."""
    root.mkdir(parents=True, exist_ok=True)
    secret_file = root / "token-secret"
    secret_file.write_text(new_token_secret() + "\n")
    secret_file.chmod(0o600)
    url = f"sqlite://{root}/authsvc.db"
    settings = Settings.from_env(
        {"AUTHSVC_STORE": url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
    )
    store = open_store(url, readonly=False, settings=settings)
    try:
        store.migrate()
        api_key = new_api_key()
        with store.write() as tx:
            game = tx.add_game("Bench", api_key_digest(api_key), int(time.time()))
            tx.add_game("Other", api_key_digest(new_api_key()), int(time.time()))
        with store.write() as tx:
            tx.import_players((i, username(i)) for i in range(1, players + 1))
    finally:
        store.close()
    rng = random.Random(seed)
    user_ids = [rng.randint(1, players) for _ in range(SAMPLE)]
    return World(
        root, url, secret_file, api_key, game.id, players, user_ids, settings.token_secrets[0]
    )


def environs(world: World, sample: int | None = None) -> list[dict]:
    """Complete WSGI environs (what Flask needs too): the world's sample of valid requests, or a new
    one."""
    rng = random.Random(sample)
    user_ids = (
        world.user_ids if sample is None else [rng.randint(1, world.players) for _ in range(sample)]
    )
    out = []
    for uid in user_ids:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": PATH,
            "QUERY_STRING": world.query(uid),
            "wsgi.input": io.BytesIO(b""),
        }
        wsgiref.util.setup_testing_defaults(environ)
        out.append(environ)
    return out


def per_call_us(
    app,
    envs: list[dict],
    calls: int,
    repeats: int,
    check: Callable[[bytes], bool],
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """``repeats`` figures, each the mean time of one call over ``calls`` calls: wall time, or
    ``clock`` (time.thread_time: CPU time, less disturbed by other processes on a busy machine)."""

    def start_response(status, headers, exc_info=None):
        return None

    for environ in envs:  # warm up, and refuse to time an app that answers wrongly
        body = b"".join(app(dict(environ), start_response))
        if not check(body):
            raise SystemExit(f"bench: in-process call answered {body[:200]!r}")
    n = len(envs)
    figures = []
    for _ in range(repeats):
        t0 = clock()
        for k in range(calls):
            b"".join(app(dict(envs[k % n]), start_response))
        figures.append((clock() - t0) / calls * 1e6)
    return figures


@dataclasses.dataclass
class PerCall:
    """In-process figures of one app: best (the least disturbed, as timeit reports) and median."""

    figures: list[float] = dataclasses.field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.figures)

    @property
    def median(self) -> float:
        return statistics.median(self.figures)


def in_process(world: World, args: argparse.Namespace) -> dict[str, PerCall]:
    from benchmarks import bare, flask_app, plain_app

    envs = environs(world)
    settings = Settings.from_env(world.env)
    db_path = world.store_url.removeprefix("sqlite://")
    # Metrics off (the metrics section times them on against off).
    authsvc = App(settings, make_app(settings).store)
    apps = {
        "bare": (bare.application, lambda body: body == bare.BODY, args.calls),
        "plain": (
            plain_app.create_app(db_path, world.secret),
            lambda body: b'"success":true' in body,
            args.calls,
        ),
        "authsvc": (authsvc, lambda body: body.startswith(b'{"success":true,'), args.calls),
        "flask": (
            flask_app.create_app(db_path, world.secret),
            lambda body: b'"success":true' in body,
            max(args.calls // 5, 1),
        ),
    }
    figures = {name: PerCall() for name in [*apps, "store"]}
    digest = api_key_digest(world.api_key)
    store_calls = [(digest, uid) for uid in world.user_ids]
    for _ in range(3):  # alternate, like the wrk rounds
        for name, (app, check, calls) in apps.items():
            figures[name].figures += per_call_us(app, envs, max(calls // 5, 1), 5, check)
        for _ in range(5):
            t0 = time.perf_counter()
            for k in range(args.calls // 5):
                authsvc.store.credentials(*store_calls[k % len(store_calls)])
            figures["store"].figures.append((time.perf_counter() - t0) / (args.calls // 5) * 1e6)
    authsvc.store.close()
    return figures


def print_in_process(figures: dict[str, PerCall], world: World) -> None:
    print(
        f"\nIn-process cost per call (the WSGI callable called directly, {world.players:,} "
        "players, random players; 3 alternating rounds of 5 runs: best and median of the 15)\n"
    )
    print("| app | µs per call, best | median | best vs plain | best vs Flask |")
    print("|---|---|---|---|---|")
    for name in ("bare", "plain", "authsvc", "flask", "store"):
        label = "authsvc: store.credentials() alone" if name == "store" else name
        f = figures[name]
        print(
            f"| {label} | {f.best:.2f} | {f.median:.2f} | {f.best / figures['plain'].best:.3f} | "
            f"{f.best / figures['flask'].best:.3f} |"
        )
