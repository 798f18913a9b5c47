"""The dependencies whose internals authsvc leans on are bounded above.

gunicorn's worker methods handle_request and handle_error (authsvc/serving/workers.py) and psycopg's
libpq layer (authsvc/store/postgres/reader.py) can change in a release. Each has an upper bound in
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

REPO = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The extras a deployment installs; the test extra's tools are not the service's.
RUNTIME = [
    Requirement(text)
    for text in PROJECT["dependencies"]
    + PROJECT["optional-dependencies"]["postgres"]
    + PROJECT["optional-dependencies"]["metrics"]
]


def test_the_runtime_dependencies_are_the_ones_named_here():
    assert sorted(r.name for r in RUNTIME) == ["gunicorn", "prometheus_client", "psycopg"]


@pytest.mark.parametrize(
    "requirement", [r for r in RUNTIME if r.name in ("gunicorn", "psycopg")], ids=lambda r: r.name
)
def test_each_dependency_whose_internals_are_used_has_an_upper_bound(requirement):
    assert any(bound.operator in ("<", "<=", "~=", "==") for bound in requirement.specifier), str(
        requirement
    )


@pytest.mark.parametrize("requirement", RUNTIME, ids=lambda r: r.name)
def test_the_installed_version_is_within_the_bounds(requirement):
    installed = importlib.metadata.version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), (
        str(requirement),
        installed,
    )
