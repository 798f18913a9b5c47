"""What the app gives the logs (docs/logs.md): route names, never a client's path; the
result code for the access logs (X-Authsvc-Result).

The same through the real nginx + gunicorn stack: tests/test_deploy.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import webtest

from authsvc.app import App, route_name
from authsvc.store import open_store

KEY = "9e258f6c-a232-442b-8d2d-f22da9c19d49"
SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def test_route_names():
    assert route_name("/api/authenticate.json") == "/api/authenticate.json"
    assert route_name("/healthz") == "/healthz"
    assert route_name(f"/api/authenticate.json?api_key={KEY}") == "<other>"
    assert route_name(None) == "<other>"


# -- X-Authsvc-Result: the spec's result for the access logs ----------------------------


@SQLITE_ONLY
@pytest.mark.parametrize("error_status", ["200", "http"])
def test_every_answer_carries_its_result_code(world, error_status):
    settings = dataclasses.replace(world.settings, error_status=error_status)
    app = webtest.TestApp(App(settings, open_store(settings.store, readonly=True, settings=settings)), lint=True)
    wire = (lambda code: 200) if error_status == "200" else (lambda code: code)
    cases = [
        (world.params(), 200, 200),
        (world.params(game_auth_token="0" * 64), 403, wire(403)),
        (world.params(api_key=None), 400, wire(400)),
    ]
    for params, result, status in cases:
        res = app.get("/api/authenticate.json", params=params, status=status)
        assert res.headers["X-Authsvc-Result"] == str(result)
        assert res.json.get("error", 200) == result
    assert app.get("/nope", status=404).headers["X-Authsvc-Result"] == "404"
    assert app.delete("/api/authenticate.json", status=405).headers["X-Authsvc-Result"] == "405"
    assert app.get("/healthz").headers["X-Authsvc-Result"] == "200"
    app.app.store.close()
