"""A pytest plugin that runs the collected tests in reverse order: ``pytest -p
harness.reverse_order``.

No test may depend on another having run first (tests/conftest.py); running the
suite backwards, modules and the tests in each, shows it. Opt-in: the default
order stays the file order, so runs are reproducible.
"""

from __future__ import annotations


def pytest_collection_modifyitems(items):
    items.reverse()
