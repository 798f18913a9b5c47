"""What the docs and configs say about the code stays true: modules, subcommands, methods, paths."""

from __future__ import annotations

import argparse
import pathlib
import re

from authsvc.cli import command as cli
from authsvc.store import base
from authsvc.store.sqlite.store import SQLiteStore

REPO = pathlib.Path(__file__).resolve().parents[2]


def _subcommands() -> list[str]:
    """Every leaf of the admin command's parser: "init", "game add", ..."""
    found = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
                return
        found.append(prefix)

    walk(cli.build_parser(), "")
    return found


def test_readme_layout_lists_every_module():
    readme = (REPO / "README.md").read_text()
    modules = [str(p.relative_to(REPO)) for p in sorted((REPO / "authsvc").rglob("*.py"))]
    missing = [
        m for m in modules if f"`{m}`" not in readme and not m.endswith("authsvc/__init__.py")
    ]
    assert not missing


def test_docs_and_the_cli_docstring_list_every_subcommand():
    commands = _subcommands()
    assert len(commands) > 15 and "check" in commands and "export" in commands
    admin = (REPO / "docs/admin.md").read_text()
    doc = cli.__doc__ or ""
    for command in commands:
        group, _, action = command.partition(" ")
        assert f"`authsvc {group}{' ' + action if action else ''}" in admin or (
            action in ("enable", "disable") and f"`authsvc {group} disable" in admin
        ), command
        line = next((ln for ln in doc.splitlines() if re.search(rf"\b{group}\b", ln)), "")
        assert not action or re.search(rf"\b{action}\b", line), command


def test_the_store_contract_names_methods_that_exist():
    methods = set(re.findall(r"``(?:SQLiteStore\.)?([a-z_]+)``", base.__doc__ or ""))
    assert {"credentials", "check", "journal_mode_warning"} <= methods
    for name in methods:
        assert hasattr(base.Store, name) or hasattr(SQLiteStore, name), name


def test_the_service_unit_names_the_admin_command_where_install_puts_it():
    installed = re.findall(
        r'put 0755 "\$work/bin/authsvc" (\S+)', (REPO / "scripts/install").read_text()
    )
    assert installed == ["/usr/local/bin/authsvc"]
    unit = (REPO / "deploy/systemd/authsvc.service").read_text()
    assert installed[0] in unit
    assert "@APP_DIR@/bin/authsvc" not in unit  # no such file is installed


def test_the_ports_and_files_a_new_user_is_told_of_are_the_scripts_own():
    """README's example of another port for scripts/serve (and its admin API on the next one)
    collides with nothing scripts/serve or scripts/demo use; docs/admin-api.md's clients and its
    schemathesis line default to scripts/serve's admin API, what a README reader runs first;
    docs/integrating.md says where scripts/demo keeps the game's api key."""
    from examples.demo import PORTS

    serve = (REPO / "scripts/serve").read_text()
    web = int(re.search(r"^port=\$\{PORT:-(\d+)\}$", serve, re.M).group(1))
    assert "admin_port=${ADMIN_PORT:-$((port + 1))}" in serve
    used = {web, web + 1, *PORTS.values()}
    readme = (REPO / "README.md").read_text()
    (example,) = re.findall(r"`PORT=(\d+) scripts/serve`", readme)
    assert {int(example), int(example) + 1}.isdisjoint(used), (example, used)
    admin_api = (REPO / "docs/admin-api.md").read_text()
    defaults = re.findall(r"AUTHSVC_ADMIN_URL\W[^\n]*?http://127\.0\.0\.1:(\d+)", admin_api)
    schemathesis = re.findall(
        r"schemathesis run http://127\.0\.0\.1:(\d+)/openapi\.json", admin_api
    )
    assert (
        len(defaults) >= 3 and len(schemathesis) == 1
    )  # the three clients (and the prose on them)
    assert {int(port) for port in defaults + schemathesis} == {web + 1}
    demo = (REPO / "examples/demo.py").read_text()
    assert (
        'REPO / "var" / "demo-loop"' in demo
        and '(var / "api-key").write_text(game["api_key"])' in demo
    )
    assert "`var/demo-loop/api-key`" in (REPO / "docs/integrating.md").read_text()
