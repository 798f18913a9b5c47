"""The service's dependencies are bounded above: authsvc leans on some of their internals.

gunicorn's worker methods (authsvc/gunicorn_workers.py), prometheus_client's multiprocess
files (authsvc/metrics_values.py, which falls back to the public API when they are not as
it expects) and psycopg's libpq layer (authsvc/store/postgres_reader.py) can change in a
release. Each runtime dependency in pyproject.toml therefore has an upper bound: the newest
release the suite has passed with; raising it is a change that runs the suite (.ci/run runs
it on the newest Python too). The versions installed here must be within the bounds, or
this run tested something a user cannot get.
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
RUNTIME = [Requirement(spec) for spec in
           PROJECT["dependencies"] + PROJECT["optional-dependencies"]["postgres"]
           + PROJECT["optional-dependencies"]["metrics"]]


def test_the_runtime_dependencies_are_the_ones_named_here():
    assert sorted(r.name for r in RUNTIME) == ["gunicorn", "prometheus_client", "psycopg"]


@pytest.mark.parametrize("requirement", RUNTIME, ids=lambda r: r.name)
def test_each_runtime_dependency_has_an_upper_bound(requirement):
    assert any(spec.operator in ("<", "<=", "~=", "==") for spec in requirement.specifier), str(requirement)


@pytest.mark.parametrize("requirement", RUNTIME, ids=lambda r: r.name)
def test_the_installed_version_is_within_the_bounds(requirement):
    installed = importlib.metadata.version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), (str(requirement), installed)
