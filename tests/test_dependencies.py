"""The dependencies whose internals authsvc leans on are bounded above.

gunicorn's worker methods (authsvc/serving/workers.py) and psycopg's libpq layer
(authsvc/store/postgres/reader.py) can change in a release. Each has an upper bound in
pyproject.toml: the newest release the suite has passed with; raising it is a change that
runs the suite. The versions installed here must be within the bounds, or this run tested
something a user cannot get. prometheus_client is used through its API only: no bound.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The extras a deployment installs; the test extra's tools are not the service's.
RUNTIME = [Requirement(text) for text in
           PROJECT["dependencies"] + PROJECT["optional-dependencies"]["postgres"]
           + PROJECT["optional-dependencies"]["metrics"]]


def test_the_runtime_dependencies_are_the_ones_named_here():
    assert sorted(r.name for r in RUNTIME) == ["gunicorn", "prometheus_client", "psycopg"]


@pytest.mark.parametrize("requirement", [r for r in RUNTIME if r.name in ("gunicorn", "psycopg")], ids=lambda r: r.name)
def test_each_dependency_whose_internals_are_used_has_an_upper_bound(requirement):
    assert any(bound.operator in ("<", "<=", "~=", "==") for bound in requirement.specifier), str(requirement)


@pytest.mark.parametrize("requirement", RUNTIME, ids=lambda r: r.name)
def test_the_installed_version_is_within_the_bounds(requirement):
    installed = importlib.metadata.version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), (str(requirement), installed)


# -- the fallbacks: each internal used, and what happens when it is not as expected -----------------
# gunicorn's workers: here.


def _worker(worker_class):
    """A gunicorn worker object as the arbiter makes one (not started)."""
    import logging
    import os

    from gunicorn.config import Config

    return worker_class(1, os.getpid(), [], None, 30, Config(), logging.getLogger("test.gunicorn_workers"))


@pytest.mark.parametrize("name", ["SyncWorker", "ThreadWorker"])
def test_the_installed_gunicorn_s_workers_are_the_familiar_ones(name):
    from authsvc.serving import workers as gunicorn_workers

    worker = _worker(getattr(gunicorn_workers, name))
    assert gunicorn_workers.familiar(getattr(gunicorn_workers, name).__bases__[0])
    assert "handle_request" not in vars(worker) and "handle_error" not in vars(worker)  # the JSON ones
    # gthread's slow-client handling (authsvc/serving/slow_clients.py) is on too
    assert not {"enqueue_req", "murder_pending", "handle", "_keepalive_after"} & set(vars(worker))


@pytest.mark.parametrize("name", ["SyncWorker", "ThreadWorker"])
def test_a_gunicorn_with_other_worker_methods_gets_its_own_workers_and_a_warning(name, monkeypatch, caplog):
    from authsvc.serving import workers as gunicorn_workers

    cls = getattr(gunicorn_workers, name)
    base = cls.__bases__[0]

    def handle_request(self, req, conn, extra):  # as a future gunicorn might have it
        return "gunicorn's own"

    monkeypatch.setattr(base, "handle_request", handle_request)
    assert not gunicorn_workers.familiar(base)
    worker = _worker(cls)
    assert worker.handle_request(1, 2, 3) == "gunicorn's own"
    assert worker.handle_error.__func__ is base.handle_error
    assert "are not the ones authsvc/serving/workers.py knows" in caplog.text
