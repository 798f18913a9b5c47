"""Rules the test suite keeps about itself (tests/conftest.py, tests/support.py).

A test module never imports another test module: what two share lives in a
support module. Tests pin an engine one way only: the ``engine`` marker. The
benchmarks never import the tests (both use harness/).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_MODULES = sorted((REPO / "tests").rglob("test_*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, as dotted names (``from tests import test_x`` gives
    tests.test_x)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            names.update(f"{base}.{alias.name}".replace("..", ".") for alias in node.names)
    return names


def is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def test_no_test_module_imports_another_test_module():
    offenders = {
        path.name: sorted(
            name
            for name in imported_modules(path)
            if is_test_module(name) or name == "tests.conftest"
        )
        for path in TEST_MODULES
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_rule_sees_every_import_form(tmp_path):
    module = tmp_path / "test_a.py"
    module.write_text(
        "import tests.test_b\nfrom tests.test_c import x\nfrom tests import test_d\nfrom .test_e "
        "import y\n"
    )
    found = {name for name in imported_modules(module) if is_test_module(name)}
    assert {"tests.test_b", "tests.test_c", "tests.test_d", ".test_e"} <= found


def test_benchmarks_never_import_the_tests():
    offenders = {
        str(path.relative_to(REPO)): sorted(
            n for n in imported_modules(path) if n == "tests" or n.startswith("tests.")
        )
        for path in sorted((REPO / "benchmarks").rglob("*.py"))
        + sorted((REPO / "harness").rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_engines_are_pinned_with_the_engine_marker_only():
    """No ``parametrize("store_url", ...)`` and no module-level ``store_url`` fixture besides
    conftest's."""
    offenders = []
    for path in TEST_MODULES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "store_url":
                offenders.append(f"{path.name}: defines a store_url fixture")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "parametrize"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and "store_url" in str(node.args[0].value)
            ):
                offenders.append(f"{path.name}:{node.lineno}: parametrizes store_url")
    assert offenders == []


# pytest's own ways of not running a test. Only tests/support.py's skip_or_fail may call them: it
# turns the skip into a failure under AUTHSVC_TEST_STRICT=1 (CI), so CI never counts a skip as a
# pass.
SKIPS = {"skip", "skipif", "importorskip", "xfail"}
SKIP_HELPER_MODULE = REPO / "tests" / "support.py"


def plain_skips(path: Path) -> list[str]:
    """Each use of pytest.skip, pytest.importorskip, pytest.xfail or a skip/skipif/xfail marker in
    a file, as "file:line: what" (``from pytest import skip`` too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in SKIPS:
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "pytest"
        ):
            found += [
                (node.lineno, f"from {node.module} import {a.name}")
                for a in node.names
                if a.name in SKIPS
            ]
    return [f"{path.name}:{line}: {what}" for line, what in sorted(found)]


def test_tests_skip_only_through_skip_or_fail():
    """A plain pytest.skip passes silently in CI; skip_or_fail (tests/support.py) fails there
    instead."""
    files = sorted((REPO / "tests").rglob("*.py"))
    assert SKIP_HELPER_MODULE in files
    offenders = [
        found for path in files if path != SKIP_HELPER_MODULE for found in plain_skips(path)
    ]
    assert offenders == [], "use tests.support.skip_or_fail(reason) instead"


def test_the_skip_rule_sees_every_form(tmp_path):
    module = tmp_path / "test_a.py"
    module.write_text(
        "import pytest\nfrom pytest import skip\npytestmark = pytest.mark.skipif(True, "
        "reason='x')\n@pytest.mark.skip\ndef test_a():\n    pytest.skip('x')\ndef test_b():\n    "
        "pytest.importorskip('x')\n    pytest.xfail('x')\n"
    )
    assert [line.split(": ", 1)[1] for line in plain_skips(module)] == [
        "from pytest import skip",
        "pytest.mark.skipif",
        "pytest.mark.skip",
        "pytest.skip",
        "pytest.importorskip",
        "pytest.xfail",
    ]


def test_every_test_module_is_in_a_tier_folder():
    """The tier is the folder a module sits in (tests/tiers.py): one in tests/ itself, or in a
    folder that is no tier's, would be in none, and --quick and the serial phase would miss it."""
    from tests.tiers import ORDER

    assert (
        sorted(
            str(path.relative_to(REPO))
            for path in TEST_MODULES
            if path.parent.name not in ORDER or path.parent.parent != REPO / "tests"
        )
        == []
    )
    assert all((REPO / "tests" / tier / "__init__.py").is_file() for tier in ORDER)


def test_every_system_lane_module_is_in_the_system_tier():
    from tests.tiers import SYSTEM_LANES

    system = {path.stem for path in TEST_MODULES if path.parent.name == "system"}
    assert (
        sorted(name for names in SYSTEM_LANES.values() for name in names if name not in system)
        == []
    )
