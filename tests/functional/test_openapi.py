"""The game-facing API's OpenAPI document (authsvc/openapi/authenticate.json; docs/api.md,
"The OpenAPI document"): a valid OpenAPI 3.1 document, served by the app at /openapi.json, and
true of the live service: schemathesis generates requests from it (valid and invalid ones) and
checks every answer of a real gunicorn against it with its default checks, in both error modes.

The document describes the default mode honestly (HTTP 200 for the 400 and 403 results, the
result in the body), so one document holds for both modes; the http mode
(AUTHSVC_ERROR_STATUS=http) is run too because one default check cannot apply to the default
mode (see test_default_mode_matches_the_document).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import hypothesis
import pytest
import schemathesis
import webtest
from openapi_spec_validator import validate

from authsvc import release
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.app import make_app, route_name
from tests import factories
from tests.support import INVALID, free_port, schemathesis_check, serve_gunicorn

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "authsvc" / "openapi" / "authenticate.json"

# Bounded and deterministic: the same requests on every run, no example database, no deadline
# (a loaded CI machine is slow, not wrong). The coverage phase adds its own fixed cases
# (missing parameters, boundary values, undeclared methods) on top of these.
FUZZ = hypothesis.settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


def _document() -> dict:
    return json.loads(DOCUMENT.read_text(encoding="utf-8"))


def test_the_document_is_valid_openapi_3_1():
    document = _document()
    assert document["openapi"].startswith("3.1.")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_every_operation_lists_its_4xx_answers():
    """Redocly's operation-4xx-response is off in redocly.yaml (for the admin document's
    /openapi.json): here it holds for every operation of this one."""
    document = _document()
    missing = [
        (path, method)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if not any(status.startswith("4") for status in op["responses"])
    ]
    assert missing == []


@pytest.mark.engine("sqlite")
def test_the_app_serves_the_document(settings, admin_store):
    app = webtest.TestApp(make_app(settings), lint=True)
    try:
        response = app.get("/openapi.json")
        document = _document()  # as served: with the release (pyproject.toml) as info.version
        assert response.json == document | {"info": document["info"] | {"version": release()}}
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.body.isascii() and b"\n" not in response.body  # compact, like every answer
        head = app.head("/openapi.json")
        assert head.body == b"" and head.headers["Content-Length"] == str(len(response.body))
        assert (
            app.post("/openapi.json").body == response.body
        )  # like the probes: GET, HEAD and POST
        assert route_name("/openapi.json") == "/openapi.json"  # logged by its name (docs/logs.md)
        refused = app.put("/openapi.json", status=405)
        assert refused.headers["Allow"] == "GET, HEAD, POST"
        assert refused.json == {
            "success": False,
            "error": 405,
            "error_description": "Method not allowed",
        }
    finally:
        app.app.store.close()


def _serve(tmp_path_factory, error_status: str | None):
    """A real gunicorn (the shipped config) on a SQLite store holding a game and a player."""
    root = tmp_path_factory.mktemp("openapi")
    secret = root / "token-secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    env = {
        "AUTHSVC_STORE": "sqlite://" + str(root / "authsvc.db"),
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret),
    }
    if error_status is not None:
        env["AUTHSVC_ERROR_STATUS"] = error_status
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    api_key = new_api_key()
    game = factories.add_game(store, "Chess", api_key_digest(api_key), int(time.time()))
    factories.add_player(store, 1001, "demo_player")
    token = mint_token(settings.token_secrets[0], game.id, 1001, store.get_player(1001).epoch)
    store.close()
    credentials = {"user_id": "1001", "game_auth_token": token, "api_key": api_key}
    port = free_port()
    proc = serve_gunicorn(
        env,
        "--graceful-timeout",
        "5",
        port=port,
        log_path=root / "gunicorn.log",
        config=REPO / "deploy" / "gunicorn.conf.py",
    )
    return proc, port, credentials


@pytest.fixture(scope="module")
def default_mode_server(tmp_path_factory):
    """(port, the credentials of its one player)."""
    proc, port, credentials = _serve(tmp_path_factory, None)
    yield port, credentials
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def http_mode_server(tmp_path_factory):
    """(port, the credentials of its one player)."""
    proc, port, credentials = _serve(tmp_path_factory, "http")
    yield port, credentials
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


def _schema():
    """The document in the repository (test_the_app_serves_the_document: the app serves exactly
    it), with schemathesis's own generation made deterministic too. Loaded when the module is:
    schemathesis makes one test per operation of it at collection."""
    schema = schemathesis.openapi.from_path(DOCUMENT)
    schema.config.generation.update(deterministic=True, database="none")
    return schema


SCHEMA = _schema()


@pytest.mark.slow
@SCHEMA.parametrize()
@FUZZ
def test_default_mode_matches_the_document(case, default_mode_server):
    """Every default check but two, on the default mode. negative_data_rejection expects an
    invalid request (a missing parameter, a malformed user_id) to get a 4xx status, and
    ignored_auth a request with a wrong api key (the document's apiKey scheme) to get 401 or 403;
    the default mode answers those with HTTP 200 and the 400 or 403 in the body, on purpose
    (docs/api.md, "Answers": old clients never read a 4xx body) and as the document says. So both
    run in the http mode (test_http_mode_matches_the_document), where they apply."""
    excluded = [schemathesis_check("negative_data_rejection"), schemathesis_check("ignored_auth")]
    case.call_and_validate(
        base_url=f"http://127.0.0.1:{default_mode_server[0]}", excluded_checks=excluded
    )


@pytest.mark.slow
@SCHEMA.parametrize()
@FUZZ
def test_http_mode_matches_the_document(case, http_mode_server):
    """All the default checks, negative_data_rejection included, with AUTHSVC_ERROR_STATUS=http."""
    case.call_and_validate(base_url=f"http://127.0.0.1:{http_mode_server[0]}")


@pytest.mark.slow
@pytest.mark.parametrize("server", ["default_mode_server", "http_mode_server"])
def test_a_success_matches_the_document(request, server):
    """Generated credentials never match, so the success answer is checked here: the player's real
    credentials in each form the document describes, through the same default checks but
    ignored_auth. Its probe sends the request again without the api key and expects 401 or 403; a
    missing api key is a missing parameter, the 400 result (docs/api.md, "Answers"), in either mode.
    That a wrong api key is refused is checked here instead, in both modes."""
    port, credentials = request.getfixturevalue(server)
    body = {**credentials, "user_id": 1001}  # a JSON body may hold user_id as an integer
    operation = SCHEMA["/api/authenticate.json"]
    cases = [
        operation["GET"].Case(query=credentials),
        operation["HEAD"].Case(query=credentials),
        operation["POST"].Case(body=body, media_type="application/json"),
        operation["POST"].Case(body=credentials, media_type="application/x-www-form-urlencoded"),
        operation["POST"].Case(body=credentials, media_type="multipart/form-data"),
    ]
    excluded = [schemathesis_check("ignored_auth")]
    for case in cases:
        response = case.call_and_validate(
            base_url=f"http://127.0.0.1:{port}", excluded_checks=excluded
        )
        assert response.status_code == 200
        if case.method != "HEAD":
            assert response.json() == {"success": True, "user_id": 1001, "username": "demo_player"}
    wrong_key = {**credentials, "api_key": "00000000-0000-4000-8000-000000000000"}
    response = (
        operation["GET"]
        .Case(query=wrong_key)
        .call_and_validate(base_url=f"http://127.0.0.1:{port}", excluded_checks=excluded)
    )
    assert response.status_code == (200 if server == "default_mode_server" else 403)
    assert response.json() == INVALID
