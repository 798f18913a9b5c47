"""One error model (authsvc/errors.py): every exception class the package defines is an ``Error``.

Each front door maps ``Error`` once (docs/design.md, "The wire"); a class outside it would
need a translation block of its own wherever it is caught. The test imports every module of the
package and checks every exception class defined there. The only exceptions are classes whose base
a library requires, each named here with the reason.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import authsvc
from authsvc.errors import Error

# A class that must derive from a library's exception instead, and why.
REQUIRED_BASES = {
    "authsvc.store.postgres.reader.ReplyTimeout":
        "psycopg.OperationalError: the reader's own deadline on a reply must fail as libpq's connection"
        " failures do (closed, never reused, the store unavailable), caught where psycopg.Error is",
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
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, Error) and name not in REQUIRED_BASES)
    assert outside == [], f"derive these from authsvc.errors.Error (or name the base they need here): {outside}"


def test_each_required_base_is_still_needed():
    classes = _exception_classes()
    for name in REQUIRED_BASES:
        assert name in classes, f"{name} is gone: remove it from REQUIRED_BASES"
        assert not issubclass(classes[name], Error), f"{name} is an Error now: remove it from REQUIRED_BASES"


def test_the_store_has_no_conflict_of_its_own():
    """The store's refusals are the model's: a taken name is the 409 every door already maps."""
    from authsvc import errors
    from authsvc.store import base

    assert base.Conflict is errors.Conflict
    assert issubclass(base.NotEmpty, errors.Conflict)
