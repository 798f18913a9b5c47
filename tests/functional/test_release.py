"""The release's version has one source, pyproject.toml, and every place a sysadmin or a client
reads it says the same: ``authsvc --version``, both OpenAPI documents' ``info.version`` as served,
the ``authsvc_build_info`` metric (docs/operations.md, "Upgrades")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from authsvc.cli import command as cli

REPO = Path(__file__).resolve().parents[2]


def pyproject_version() -> str:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version  # semantic: MAJOR.MINOR.PATCH
    return version


def test_authsvc_version_prints_the_release(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"authsvc {pyproject_version()}\n"


def test_both_openapi_documents_carry_the_release_as_served(app, admin):
    version = pyproject_version()
    assert app.get("/openapi.json").json["info"]["version"] == version
    assert admin.app.get("/openapi.json").json["info"]["version"] == version


def test_the_build_info_metric_names_the_release(app):
    text = app.get("/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("authsvc_build_info{"))
    assert f'version="{pyproject_version()}"' in line


def test_the_changelog_has_a_section_for_the_release():
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(
        rf"^## \[{re.escape(pyproject_version())}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M
    ), "CHANGELOG.md needs a Keep a Changelog section for the version in pyproject.toml"
