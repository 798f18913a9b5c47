"""The suite's tiers (README.md, "Test it"): each test module sits in its tier's folder,
tests/TIER/, and tests/conftest.py marks its tests with the folder's name.

- unit: no I/O beyond a temporary file: parsers, rules, the repository's own rules. A socket or a
  process is an error there (tests/unit/conftest.py).
- functional: the WSGI apps through WebTest and the admin command, on a SQLite store: the front
  doors are engine-blind (every statement is the store's), so PostgreSQL gets a smoke test of
  each door (tests/functional/test_postgres_smoke.py) instead of a second copy of every file.
- store: the store contract, each engine's own behaviour, and what runs engine-specific SQL through
  a front door (the write path, the audit chain, the batch, export/import, API tokens): on both
  engines.
- integration: real gunicorn, nginx, PostgreSQL servers of their own (a failover among them),
Chromium,
  the install, the bench's sections at their smallest, on loopback.
- system: what bounds a time or drives a load: network faults, an app host killed, storms, slow
  clients, a standby's staleness, the history under kill -9: they run after the others, in two lanes
  (``SYSTEM_LANES``): the network faults beside the rest, each lane one test at a time.

``scripts/test --quick`` runs unit and functional; ``scripts/test`` runs the first four in parallel
(pytest-xdist), then system in its two lanes. Every test module is in a tier's folder
(tests/unit/test_suite_rules.py).
"""

from __future__ import annotations

from pathlib import Path

# The tier folders, in the order scripts/test runs them.
ORDER = ("unit", "functional", "store", "integration", "system")
# The system tier runs in two lanes side by side, each one test at a time (scripts/test: pytest -m
# "system and lane_NAME"): the network faults, which mostly wait on cuts and bounds, in one; what
# drives a load or kills processes in the other.
SYSTEM_LANES: dict[str, tuple[str, ...]] = {"network": ("test_store_network", "test_standby")}
LANES = ("network", "load")  # "load": every other system-tier module
# The tiers whose tests run on both engines unless an ``engine`` marker pins one; elsewhere SQLite.
BOTH_ENGINES = ("store", "integration", "system")


def system_lane(module: str) -> str:
    """The lane of a system-tier module (its mark: lane_network or lane_load)."""
    return next((lane for lane, modules in SYSTEM_LANES.items() if module in modules), "load")


def tier_of(path: Path) -> str | None:
    """The tier of a test module: the name of the folder it sits in, None if that is not a
    tier's."""
    return path.parent.name if path.parent.name in ORDER else None
