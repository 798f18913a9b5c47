"""One error model (authsvc/errors.py): every exception class the package defines is an ``Error``.

Each front door maps ``Error`` once (docs/design.md, "The wire"); a class outside it would
need a translation block of its own wherever it is caught. The test imports every module of the
package and checks every exception class defined there. The only exceptions are classes whose base
a library requires, each named here with the reason.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import authsvc
from authsvc.errors import BadRequest, Error, InvalidCredentials, MissingCredentials
from authsvc.web import answers

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "authsvc"
ANSWERS = PACKAGE / "web" / "answers.py"

# A class that must derive from a library's exception instead, and why.
REQUIRED_BASES = {
    "authsvc.store.postgres.reader.ReplyTimeout": "psycopg.OperationalError: the reader's own "
    "deadline on a reply must fail as libpq's connection failures do (closed, never reused, the "
    "store unavailable), caught where psycopg.Error is",
}


def _exception_classes() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(authsvc.__path__, "authsvc."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_class_of_the_package_is_an_error_of_the_model():
    classes = _exception_classes()
    assert len(classes) > 25, sorted(classes)  # the walk found the package's classes
    outside = sorted(
        name
        for name, cls in classes.items()
        if not issubclass(cls, Error) and name not in REQUIRED_BASES
    )
    assert outside == [], (
        f"derive these from authsvc.errors.Error (or name the base they need here): {outside}"
    )


def test_each_required_base_is_still_needed():
    classes = _exception_classes()
    for name in REQUIRED_BASES:
        assert name in classes, f"{name} is gone: remove it from REQUIRED_BASES"
        assert not issubclass(classes[name], Error), (
            f"{name} is an Error now: remove it from REQUIRED_BASES"
        )


def test_the_store_has_no_conflict_of_its_own():
    """The store's refusals are the model's: a taken name is the 409 every door already maps."""
    from authsvc import errors
    from authsvc.store import base

    assert base.Conflict is errors.Conflict
    assert issubclass(base.NotEmpty, errors.Conflict)


def _game_json_writers(path: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
    """Where a module writes the game door's error shape itself: the key "error_description" in code
    (docstrings aside), in text or bytes, or a call of a helper named ``error_object``."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and id(node) not in docstrings
            and isinstance(node.value, (str, bytes))
        ):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if "error_description" in text:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "error_object"
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_game_doors_bodies_come_from_its_one_table():
    """The game door's error bodies are written in authsvc/web/answers.py only: its app's boundary,
    an authentication's refusals and the workers' answers to what gunicorn refuses all take them
    from there."""
    writers = [
        where
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ANSWERS
        for where in _game_json_writers(path)
    ]
    assert _game_json_writers(ANSWERS), "the rule no longer sees the table's own body"
    assert writers == [], f"take the game door's bodies from authsvc/web/answers.py: {writers}"


def test_the_game_door_rule_sees_every_form(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        '"""A docstring may say "error_description"."""\nA = {"error_description": "x"}\nB = '
        'b\'{"success":false,"error":403,"error_description":"Invalid credentials"}\'\nC = '
        'http.error_object(400, "x")\n'
    )
    assert sorted(where.rpartition(":")[2] for where in _game_json_writers(module, tmp_path)) == [
        "2",
        "3",
        "4",
    ]


def test_the_game_doors_table_answers_in_the_words_of_the_api():
    """The refusals' bodies (docs/api.md, "Answers"), byte for byte, and the HTTP statuses they
    travel with."""
    assert answers.REFUSALS == {
        MissingCredentials: b'{"success":false,"error":400,"error_description":"user_id, '
        b'game_auth_token, and api_key are required parameters"}',
        InvalidCredentials: b'{"success":false,"error":403,"error_description":"Invalid '
        b'credentials"}',
    }
    assert answers.body_of(BadRequest("Request has more than 16 parameters")) == (
        b'{"success":false,"error":400,"error_description":"Request has more than 16 parameters"}'
    )
    assert (
        answers.body_of(Error)
        == b'{"success":false,"error":500,"error_description":"Internal server error"}'
    )
    assert answers.http_statuses(errors_as_http_status=False) == {400: 200, 403: 200}
    assert answers.http_statuses(errors_as_http_status=True) == {}
