"""The admin API's OpenAPI document (authsvc/openapi/admin.json; docs/admin-api.md, "The OpenAPI
document"): a valid OpenAPI 3.1 document, served by the admin app at /openapi.json, and true of the
live service: schemathesis generates requests from it (valid and invalid ones) and checks every
answer of the admin API under a real gunicorn against it, with every default check.

The caller holds a token with every scope, so generated requests reach the resources; the
ignored_auth check sends each one again without it (and with a wrong one) and expects 401.
Generated ids rarely name a stored player or game, so test_each_success_matches_the_document
sends real ones through the same checks, and the stateful phase
(test_the_stateful_phase_follows_the_links_with_every_default_check) follows the document's links
from a resource just made to the next call.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import time
import unicodedata
from pathlib import Path

import hypothesis
import jsonschema
import pytest
import schemathesis
import webtest
from openapi_spec_validator import validate
from schemathesis.core.parameters import ParameterLocation

from authsvc import release
from authsvc.api.app import AdminApp
from authsvc.errors import Invalid
from authsvc.names import HIDDEN_CATEGORIES, MAX_GAME_NAME, check_game_name, check_username
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, new_api_key
from tests import factories
from tests.support import fan_out, free_port, schemathesis_check, serve_gunicorn

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "authsvc" / "openapi" / "admin.json"
ALL_SCOPES = [
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
    "webhooks:read",
    "webhooks:write",
]

# Bounded and deterministic: the same requests on every run, no example database, no deadline
# (a loaded CI machine is slow, not wrong). The coverage phase adds its own fixed cases
# (missing fields, boundary values, undeclared methods, other media types) on top of these.
FUZZ = hypothesis.settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


def _document() -> dict:
    document = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    document["info"]["version"] = release()  # as served: the release (pyproject.toml)
    return document


def test_the_document_is_valid_openapi_3_1():
    document = _document()
    assert document["openapi"].startswith("3.1.")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_every_route_is_described_with_its_scope():
    """Each operation of the document names the scope routes.py asks for, and each route is in
    it."""
    from authsvc.api import routes

    document = _document()
    implemented = {}
    for pattern, methods in routes._ROUTES:
        path = routes.template(pattern)  # also the access line's name of the route (docs/logs.md)
        for method, (_, scope) in methods.items():
            implemented[(path, method.lower())] = scope
    described = {
        (path, method): op.get("x-authsvc-scope")
        for path, item in document["paths"].items()
        for method, op in item.items()
        if path != "/openapi.json" and method != "head"
    }
    assert described == implemented
    for (path, method), scope in described.items():
        assert document["paths"][path][method]["security"] == [{"bearer": [scope]}]
        # Redocly's operation-4xx-response is off for this document (redocly.yaml), for
        # /openapi.json's sake.
        assert any(
            status.startswith("4") for status in document["paths"][path][method]["responses"]
        ), (path, method)


@pytest.mark.engine("sqlite")
def test_the_admin_app_serves_the_document_without_a_token(settings, admin_store):
    app = webtest.TestApp(AdminApp(settings), lint=True)
    try:
        response = app.get("/openapi.json")
        assert response.json == _document()
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers["Cache-Control"] == "no-store"
        assert response.body.isascii() and b"\n" not in response.body  # compact, like every answer
        head = app.head("/openapi.json")
        assert head.body == b"" and head.headers["Content-Length"] == str(len(response.body))
        refused = app.post("/openapi.json", status=405)
        assert refused.headers["Allow"] == "GET, HEAD"
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert (
            app.get("/v1/audit", status=401).headers["WWW-Authenticate"].startswith("Bearer")
        )  # only it is open
    finally:
        app.app.store.close()


class Live:
    """The admin API under gunicorn: its base URL, a token with every scope, stored ids, and its
    settings."""

    def __init__(self, base_url: str, token: str, game_id: int, user_id: int, settings: Settings):
        self.base_url = base_url
        self.settings = settings
        self.headers = {"Authorization": f"Bearer {token}"}
        self.game_id = game_id
        self.user_id = user_id


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(request, tmp_path_factory):
    """A real gunicorn serving authsvc.api.wsgi:application over TCP loopback, on a migrated store
    (each engine: a value one engine cannot hold is found on that one) holding a game, a player and
    an API token with every scope."""
    root = tmp_path_factory.mktemp("admin-openapi")
    secret = root / "token-secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    if request.param == "sqlite":
        store_url = "sqlite://" + str(root / "authsvc.db")
    else:
        store_url = request.getfixturevalue("pg_databases").create()
    env = {
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret),
        # The per-token rate limit off: this is one caller sending as fast as it can, and a run of
        # 429s would leave the resources untried. The 429 is in the document all the same.
        "AUTHSVC_ADMIN_RATE": "0",
    }
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    game = factories.add_game(store, "Chess", api_key_digest(new_api_key()), int(time.time()))
    factories.add_player(store, 1001, "demo_player")
    _, token = api_tokens.add_api_token(
        store, Context(actor="cli:test"), "schemathesis", ALL_SCOPES, None
    )
    store.close()
    port = free_port()
    log_path = root / "gunicorn.log"
    proc = serve_gunicorn(
        env,
        "--graceful-timeout",
        "5",
        "--access-logfile",
        "-",
        port=port,
        log_path=log_path,
        app="authsvc.api.wsgi:application",
        workers=2,
    )
    yield Live(f"http://127.0.0.1:{port}", token, game.id, 1001, settings)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    output = log_path.read_text(errors="replace")
    assert "Traceback" not in output, output  # no request made the app fail
    assert token not in output  # nor reached a log


def _schema():
    """The document in the repository (test_the_admin_app_serves_the_document_without_a_token: the
    app serves exactly it), with schemathesis's own generation made deterministic too. Loaded from
    its path when the module is: schemathesis makes one test per operation of it at collection."""
    schema = schemathesis.openapi.from_path(DOCUMENT)
    schema.config.generation.update(deterministic=True, database="none")
    # positive_data_acceptance stays on, with one status more than its default list: 412 is the
    # answer to a well-formed If-Match naming a version the player is not at, and which version is
    # current is state the generator cannot know (PUT and DELETE /v1/players/{user_id} read
    # If-Match).
    acceptance = schema.config.checks.positive_data_acceptance
    acceptance.expected_statuses = [*acceptance.expected_statuses, "412"]
    return schema


SCHEMA = _schema()
_KEYS = itertools.count(1)


def _unique_key(case) -> None:
    """A valid generated Idempotency-Key made unique to its case (a counter in front)."""
    key = (case.headers or {}).get("Idempotency-Key")
    if key is not None and case.meta is not None and case.meta.generation.mode.is_positive:
        case.headers["Idempotency-Key"] = f"{next(_KEYS)}-{key}"[:255]


@pytest.mark.slow
@SCHEMA.parametrize()
@FUZZ
def test_the_live_admin_api_matches_the_document(case, live):
    """Every default check, none excluded: any failure fails the suite.

    A valid generated Idempotency-Key is made unique to its case (a counter in front): the generator
    draws the same few keys for many requests, and a key already used with another request is
    rightly 422 (idempotency-key-reused), which positive_data_acceptance would take for valid data
    refused. Invalid keys (negative cases) are sent as generated. The replay is tested in
    test_each_success_matches_the_document and tests/functional/test_admin_api.py.

    An invalid item of a batch (a ``players`` item that breaks BatchPlayer's rules) is answered 200
    with its own error in ``results``, as the document says; negative_data_rejection would take that
    200 for invalid data accepted. So a batch whose body is invalid and is answered 200 must report
    an item's error instead."""
    _unique_key(case)
    if (
        case.operation.label == "POST /v1/players/batch"
        and case.meta is not None
        and case.meta.is_negative_at(ParameterLocation.BODY)
    ):
        response = case.call_and_validate(
            base_url=live.base_url,
            headers=live.headers,
            excluded_checks=[schemathesis_check("negative_data_rejection")],
        )
        assert response.status_code != 200 or response.json()["counts"]["error"] >= 1, (
            case.body,
            response.text,
        )
        return
    case.call_and_validate(base_url=live.base_url, headers=live.headers)


@pytest.mark.slow
def test_each_success_matches_the_document(live):
    """Generated ids rarely name a stored player or game, so each success, a replay and a 412 are
    sent here with real ones, through the same default checks."""
    base, headers = live.base_url, live.headers

    def send(path: str, method: str, status: int, **kwargs):
        """The answer, as schemathesis reads it: header names in lower case, each with a list of
        values."""
        case = SCHEMA[path][method].Case(**kwargs)
        response = case.call_and_validate(base_url=base, headers=headers)
        assert response.status_code == status, response.text
        return response

    player = {"user_id": live.user_id}
    etag = send("/v1/players/{user_id}", "GET", 200, path_parameters=player).headers["etag"][0]
    send("/v1/players/{user_id}", "HEAD", 200, path_parameters=player)
    renamed = send(
        "/v1/players/{user_id}",
        "PUT",
        200,
        path_parameters=player,
        headers={"If-Match": etag},
        body={"username": "renamed", "enabled": True},
        media_type="application/json",
    )
    send(
        "/v1/players/{user_id}",
        "PUT",
        412,
        path_parameters=player,
        headers={"If-Match": etag},
        body={"username": "lost"},
        media_type="application/json",
    )
    send(
        "/v1/players/{user_id}",
        "PUT",
        201,
        path_parameters={"user_id": 2002},
        body={"username": "second"},
        media_type="application/json",
    )
    deleted = send(
        "/v1/players/{user_id}",
        "DELETE",
        200,
        path_parameters={"user_id": 2002},
        headers={"Idempotency-Key": "success-delete"},
    )
    again = send(
        "/v1/players/{user_id}",
        "DELETE",
        200,
        path_parameters={"user_id": 2002},
        headers={"Idempotency-Key": "success-delete"},
    )
    assert again.json() == deleted.json() and again.headers["idempotent-replayed"] == ["true"]
    send("/v1/players/{user_id}", "DELETE", 404, path_parameters={"user_id": 2002})
    send(
        "/v1/players/{user_id}",
        "PUT",
        201,
        path_parameters={"user_id": 2002},
        body={"username": "second"},
        media_type="application/json",
    )
    send(
        "/v1/players/{user_id}",
        "DELETE",
        412,
        path_parameters={"user_id": 2002},
        headers={"If-Match": etag},
    )
    first = send(
        "/v1/players/{user_id}/revoke",
        "POST",
        200,
        path_parameters=player,
        headers={"Idempotency-Key": "success-revoke"},
    )
    again = send(
        "/v1/players/{user_id}/revoke",
        "POST",
        200,
        path_parameters=player,
        headers={"Idempotency-Key": "success-revoke"},
    )
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == ["true"]
    assert first.json()["epoch"] == renamed.json()["epoch"] + 1
    players = [
        {"user_id": 3003, "username": "third"},
        {"user_id": live.user_id, "username": "renamed"},
        {"user_id": 0, "username": " bad"},
    ]
    for dry_run in (True, False):
        batch = send(
            "/v1/players/batch",
            "POST",
            200,
            body={"players": players, "dry_run": dry_run},
            media_type="application/json",
        ).json()
        assert [r["status"] for r in batch["results"]] == ["created", "unchanged", "error"]
    game = {"game_id": live.game_id}
    # enabled again: a generated PATCH (the other tests share this server) may have disabled it
    send(
        "/v1/games/{game_id}",
        "PATCH",
        200,
        path_parameters=game,
        body={"enabled": True},
        media_type="application/json",
    )
    send("/v1/games/{game_id}", "GET", 200, path_parameters=game)
    send("/v1/games/{game_id}", "HEAD", 200, path_parameters=game)
    minted = send(
        "/v1/tokens",
        "POST",
        200,
        body={"game_id": live.game_id, "user_id": live.user_id},
        media_type="application/json",
    )
    assert minted.json()["epoch"] == first.json()["epoch"]
    send(
        "/v1/games/{game_id}/keys",
        "POST",
        201,
        path_parameters=game,
        headers={"Idempotency-Key": "success-rotate"},
        body={"old_key_ttl": 60},
        media_type="application/json",
    )
    replay = send(
        "/v1/games/{game_id}/keys",
        "POST",
        409,
        path_parameters=game,
        headers={"Idempotency-Key": "success-rotate"},
        body={"old_key_ttl": 60},
        media_type="application/json",
    )
    assert replay.json()["type"] == "urn:authsvc:problem:idempotency-secret-not-kept"
    send("/v1/games", "POST", 201, body={"name": " Chess 2 "}, media_type="application/json")
    page = send("/v1/audit", "GET", 200, query={"limit": 2, "player": live.user_id}).json()
    assert len(page["records"]) == 2 and page["next"] is not None
    send(
        "/v1/audit",
        "GET",
        200,
        query={"after": page["next"], "action": "player.add", "actor": "cli:test"},
    )
    hook = send(
        "/v1/webhooks",
        "POST",
        201,
        headers={"Idempotency-Key": "success-webhook"},
        media_type="application/json",
        body={
            "url": "https://game.example.com/events",
            "events": ["player.revoked"],
            "game_id": live.game_id,
        },
    )
    replay = send(
        "/v1/webhooks",
        "POST",
        409,
        headers={"Idempotency-Key": "success-webhook"},
        media_type="application/json",
        body={
            "url": "https://game.example.com/events",
            "events": ["player.revoked"],
            "game_id": live.game_id,
        },
    )
    assert replay.json()["webhook_id"] == hook.json()["id"]
    webhook = {"webhook_id": hook.json()["id"]}
    send("/v1/webhooks", "GET", 200)
    send("/v1/webhooks/{webhook_id}", "GET", 200, path_parameters=webhook)
    send("/v1/players/{user_id}/revoke", "POST", 200, path_parameters=player)
    store = open_store(live.settings.store, readonly=False, settings=live.settings)
    try:
        fan_out(store)  # the deliverer's step: the revoke's delivery
    finally:
        store.close()
    (delivery,) = send(
        "/v1/webhooks/{webhook_id}/deliveries",
        "GET",
        200,
        path_parameters=webhook,
        query={"state": "pending", "limit": 1},
    ).json()["deliveries"]
    send(
        "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/retry",
        "POST",
        409,
        path_parameters=webhook | {"delivery_id": delivery["id"]},
    )
    due = send(
        "/v1/webhooks/{webhook_id}/deliveries/retry",
        "POST",
        200,
        path_parameters=webhook,
        query={"state": "failed"},
        headers={"Idempotency-Key": "success-redrive"},
    )
    assert due.json() == {"webhook_id": webhook["webhook_id"], "due_now": 0}
    send("/v1/webhooks/{webhook_id}", "DELETE", 200, path_parameters=webhook)
    (kept,) = send(
        "/v1/webhooks/{webhook_id}/deliveries", "GET", 200, path_parameters=webhook
    ).json()["deliveries"]
    assert (kept["id"], kept["user_id"], kept["state"]) == (delivery["id"], live.user_id, "failed")
    failed = send(
        "/v1/webhooks/{webhook_id}/deliveries/retry", "POST", 404, path_parameters=webhook
    )
    assert failed.json()["type"] == "urn:authsvc:problem:not-found"
    document = send("/openapi.json", "GET", 200).json()
    assert document == _document()


# The stateful phase: scenarios of a few calls each, every next call along a link of the document
# (authsvc/openapi/admin.json: a player written, then read, revoked or changed with its ETag; a game
# made, then read, patched or given a key) or one schemathesis infers, every answer through every
# default check and the stateful ones (a resource a call just made must be found by the next).
# schemathesis starts a scenario only at a POST that makes something (POST /v1/games) when the
# document has one, so the players' links are run by a second machine without the games, whose
# scenarios start at PUT (or GET) /v1/players/{user_id}. Bounded: STATEFUL_RUNS runs of max_examples
# scenarios of at most stateful_step_count calls (schemathesis's default), about 30 s in all.
STATEFUL = hypothesis.settings(
    FUZZ,
    max_examples=10,
    stateful_step_count=6,
    derandomize=False,
    phases=[hypothesis.Phase.generate],
)
STATEFUL_RUNS = (
    2  # seeds 1 and 2: the same scenarios each time, but for schemathesis's own true randomness
)
# Reached through a link with a success, or the phase tested nothing: each machine's linked
# operations.
LINKED = {
    "games": {
        "POST /v1/games",
        "GET /v1/games/{game_id}",
        "PATCH /v1/games/{game_id}",
        "POST /v1/games/{game_id}/keys",
    },
    "players": {
        "PUT /v1/players/{user_id}",
        "GET /v1/players/{user_id}",
        "POST /v1/players/{user_id}/revoke",
        "DELETE /v1/players/{user_id}",
    },
}


def _stateful_schema():
    """_schema(), its scenarios generated from valid data only. The invalid data of each operation
    is test_the_live_admin_api_matches_the_document's; here a link's values replace generated ones
    (an inferred link from a game's answer fills a PATCH's body with its "enabled"), and an invalid
    request made valid that way is then reported as "invalid data accepted"."""
    schema = _schema()
    schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE])
    return schema


STATEFUL_SCHEMA = _stateful_schema()
_FRESH_IDS = itertools.count(9_000_000_000_000_000_001)  # never stored before a scenario writes one
_NAMES = itertools.count(1)


class _Scenarios:
    """What a machine's scenarios share: the calls that succeeded, the check failures seen."""

    def __init__(self):
        self.reached: set[str] = set()
        self.failures: list[BaseException] = []


def _workflow(schema, live: Live, seen: _Scenarios):
    """A state machine of ``schema`` calling the live service, whose scenarios depend on their own
    calls only: schemathesis (like Hypothesis) replays the start of an earlier scenario to explore
    from it, and an answer that differs the second time (a game name taken by then, a generated id
    that a call of an earlier scenario stored meanwhile) is "flaky" data to it. So the id of a
    scenario's first call is replaced by one never stored (the same answer every time: 404, or a
    creation), a new game's name is made unique, and an Idempotency-Key too (_unique_key). The token
    goes in the case's own headers: the stateful check that a resource just made is found looks only
    at calls whose every parameter (the Authorization header too) was given, not generated."""

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def step(self, input):
            self.first_call = input.transition is None
            return super().step(input)

        def before_call(self, case):
            _unique_key(case)
            if case.meta is None or not case.meta.generation.mode.is_positive:
                return
            case.headers = {**(case.headers or {}), **live.headers}
            if self.first_call:
                for name, value in (case.path_parameters or {}).items():
                    if type(value) is int:
                        case.path_parameters[name] = next(_FRESH_IDS)
            if (
                case.method.upper() == "POST"
                and case.path == "/v1/games"
                and isinstance(case.body, dict)
                and isinstance(case.body.get("name"), str)
            ):
                case.body["name"] = (f"{next(_NAMES)}-" + case.body["name"].strip())[:200]

        def get_call_kwargs(self, case):
            return {"base_url": live.base_url, "headers": live.headers}

        def after_call(self, response, case):
            super().after_call(response, case)
            if response.status_code < 300:
                seen.reached.add(f"{case.method.upper()} {case.path}")

        def validate_response(self, response, case, *args, **kwargs):
            try:
                super().validate_response(response, case, *args, **kwargs)
            except BaseException as e:
                seen.failures.append(e)
                raise

    return Workflow


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["games", "players"])
def test_the_stateful_phase_follows_the_links_with_every_default_check(live, machine):
    """Any check failure fails the suite, also one Hypothesis could not replay (the service's state
    moved on). A run Hypothesis ends as "flaky" for a difference the isolation above does not remove
    (schemathesis draws some choices from true randomness) ends that run only, as schemathesis's own
    runner does; the next seed goes on. A machine that did not reach each of its linked operations
    with a success fails too: the phase would have tested nothing there."""
    # The webhooks' links are left to test_each_success_matches_the_document: a generated URL is
    # mostly 422 (AUTHSVC_WEBHOOK_ALLOW_HOSTS, the service's setting), and their scenarios would
    # crowd out the games'.
    schema = STATEFUL_SCHEMA.exclude(path_regex="^/v1/webhooks")
    if machine == "players":
        schema = schema.exclude(path_regex="^/v1/games")
    seen = _Scenarios()
    ended_early = []
    for seed in range(1, STATEFUL_RUNS + 1):
        workflow = hypothesis.seed(seed)(_workflow(schema, live, seen))
        try:
            workflow.run(settings=STATEFUL)
        except BaseException as e:
            if seen.failures:
                raise seen.failures[0] from None
            if not _ends_the_run_only(e):
                raise
            ended_early.append(type(e).__name__)
    assert LINKED[machine] <= seen.reached, (sorted(LINKED[machine] - seen.reached), ended_early)


def _ends_the_run_only(error: BaseException) -> bool:
    """What ends a run of the state machine without a check having failed, as schemathesis's own
    runner takes it: "flaky" data (a replay that drew differently), or a scenario in which
    schemathesis's transition controller allows no further call ("No progress can be made": it caps
    the calls per source)."""
    if isinstance(error, hypothesis.errors.Flaky):
        return True
    return isinstance(error, hypothesis.errors.InvalidDefinition) and str(error).startswith(
        "No progress can be made"
    )


def _class(codes: set[int]) -> str:
    """A regular-expression character class's inside naming ``codes`` (all in the BMP), as
    ``\\uXXXX`` escapes, which ECMA-262 and Python's ``re`` read alike."""
    assert max(codes) < 0x10000
    runs: list[list[int]] = []
    for code in sorted(codes):
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "".join(
        f"\\u{first:04x}" if first == last else f"\\u{first:04x}-\\u{last:04x}"
        for first, last in runs
    )


# Lone surrogates (Cs) are hidden characters the service refuses, but no pattern names them for
# every engine: Python's and JavaScript's would (``\ud800-\udfff``), while an engine whose strings
# are UTF-8 refuses to compile such a pattern (jsonschema-rs, which schemathesis generates with,
# then ignores the pattern altogether). Only a JSON escape can carry one, and the service answers it
# 422.
SURROGATES = set(range(0xD800, 0xE000))


def names_patterns() -> tuple[str, str]:
    """The username and game-name patterns that say authsvc/names.py's rule with this Python's
    Unicode database: what the document should hold (the test below prints them when it does not).

    Written so that every engine compiles them and reads them alike. Hidden characters in the BMP
    are ``\\uXXXX`` escapes in character classes. Those outside it (a few format characters) are
    written as themselves, one by one, in a lookahead that refuses a name holding any of them:
    ECMA-262 with the u flag reads one as a character, Python too (``\\u{...}`` is JavaScript's
    only, ``\\U000XXXXX`` Python's only), and one without the u flag (ajv-formats' "regex" format,
    which Spectral checks the document with) reads it as its two UTF-16 units, which still name the
    same character; a range of them would not compile there. The username's length is maxLength's
    alone (JavaScript without the u flag counts UTF-16 units in a pattern's bounds). The end is
    ``$(?!\\n)``: Python's ``$`` also matches before a final newline, JavaScript's does not."""
    hidden = {
        code for code in range(0x110000) if unicodedata.category(chr(code)) in HIDDEN_CATEGORIES
    } - SURROGATES
    space = {
        code for code in range(0x110000) if chr(code).isspace()
    } - hidden  # what str.strip() drops
    bmp = {code for code in hidden if code < 0x10000}
    none_outside = "(?![\\s\\S]*(?:" + "|".join(chr(code) for code in sorted(hidden - bmp)) + "))"
    h, s, hs = _class(bmp), _class(space), _class(bmp | space)
    username = f"^{none_outside}[^{hs}](?:[^{h}]*[^{hs}])?$(?!\\n)"
    game_name = (
        f"^{none_outside}[{s}]*[^{hs}](?:[^{h}]{{0,{MAX_GAME_NAME - 2}}}[^{hs}])?[{s}]*$(?!\\n)"
    )
    return username, game_name


def test_the_documents_names_rule_is_the_services():
    """The username and game-name patterns say what authsvc/names.py accepts, character by character
    (but lone surrogates, SURROGATES above), read as JSON Schema reads a pattern (a search, not a
    whole match), with this Python's Unicode database: a new Unicode version that moves a character
    in or out of the hidden categories fails here, and the document is brought along
    (names_patterns() prints the new patterns). Ajv reads them the same way
    (tests/integration/test_openapi_clients.py)."""
    schemas = _document()["components"]["schemas"]
    username = re.compile(schemas["PlayerPut"]["properties"]["username"]["pattern"])
    game_name = re.compile(schemas["GameAdd"]["properties"]["name"]["pattern"])
    assert schemas["BatchPlayer"]["properties"]["username"]["pattern"] == username.pattern

    def accepts(check, name: str) -> bool:
        try:
            check(name)
        except Invalid:
            return False
        return True

    differ = []
    for code in sorted(set(range(0x110000)) - SURROGATES):
        char = chr(code)
        for name in (char, "a" + char + "b"):
            if bool(username.search(name)) != accepts(check_username, name):
                differ.append(("username", name))
            if bool(game_name.search(name)) != accepts(check_game_name, name):
                differ.append(("game name", name))
    assert not differ, (
        differ[:10],
        "the patterns of this Python's Unicode database:",
        names_patterns(),
    )
    # The length bounds, through the whole property schema as JSON Schema reads it (maxLength counts
    # characters, the username's pattern no length).
    properties = {
        "username": (schemas["PlayerPut"]["properties"]["username"], check_username),
        "game name": (schemas["GameAdd"]["properties"]["name"], check_game_name),
    }
    names = {
        "username": (
            "x" * 255,
            "x" * 256,
            "\U0001f3ae" * 255,
            "\U0001f3ae" * 256,
            " x",
            "x\u00a0",
            "\u3000x",
            "x\n",
            "\nx",
        ),
        "game name": (
            "x" * 200,
            "x" * 201,
            "\U0001f3ae" * 200,
            "\U0001f3ae" * 201,
            "\u2003" + "x" * 200 + " ",
            "   ",
            "x\n",
            " x \n",
        ),
    }
    for what, (schema, check) in properties.items():
        for name in names[what]:
            assert jsonschema.Draft202012Validator(schema).is_valid(name) == accepts(check, name), (
                what,
                name,
            )
