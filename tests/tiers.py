"""The suite's tiers (README.md, "Test it"): each test module in one, marked by tests/conftest.py.

- unit: no I/O beyond a temporary file: parsers, rules, the repository's own rules.
- functional: the WSGI apps through WebTest and the admin command, on a SQLite store: the front
  doors are engine-blind (every statement is the store's), so PostgreSQL gets a smoke test of
  each door (tests/test_postgres_smoke.py) instead of a second copy of every file.
- store: the store contract, each engine's own behaviour, and what runs engine-specific SQL through
  a front door (the write path, the audit chain, the batch, export/import, API tokens): on both engines.
- integration: real gunicorn, nginx, PostgreSQL servers of their own (a failover among them), Chromium,
  the install, the bench's sections at their smallest, on loopback.
- system: what bounds a time or drives a load: network faults, an app host killed, storms, slow
  clients, a standby's staleness, the history under kill -9: they run after the others, in two lanes
  (``SYSTEM_LANES``): the network faults beside the rest, each lane one test at a time.

``scripts/test --quick`` runs unit and functional; ``scripts/test`` runs the first four in parallel
(pytest-xdist), then system in its two lanes. A new test module must be placed here (tests/test_suite_rules.py).
"""

from __future__ import annotations

TIERS: dict[str, tuple[str, ...]] = {
    "unit": (
        "test_admin_route_map", "test_dependencies", "test_deploy_render", "test_docs_links", "test_drift", "test_error_model",
        "test_gunicorn_config", "test_http", "test_layout", "test_loglines", "test_logredact", "test_repo_rules",
        "test_settings", "test_suite_rules", "test_tokens",
    ),
    "functional": (
        "test_admin_api", "test_admin_edges", "test_backup", "test_boundary",
        "test_check", "test_cli", "test_endpoint", "test_equal_work", "test_explain", "test_hostile",
        "test_metrics", "test_minted_after_a_change", "test_openapi", "test_postgres_smoke", "test_probes",
        "test_queueing", "test_reasons", "test_release", "test_sqlite_faults", "test_staleness", "test_store_sqlite",
        "test_store_urls", "test_webhooks_api", "test_wsgi",
    ),
    "store": (
        "test_admin_batch", "test_api_tokens", "test_audit", "test_audit_anchor", "test_deliver", "test_erasure",
        "test_events",
        "test_postgres_deploy", "test_postgres_store", "test_snapshot_lock", "test_store_contract",
        "test_store_replaced", "test_transfer", "test_wal", "test_write_path",
    ),
    "integration": (
        "test_admin_api_examples", "test_admin_api_gunicorn", "test_admin_cost", "test_admin_openapi",
        "test_admin_serving", "test_bench", "test_deliver_process", "test_deploy", "test_edge",
        "test_forged_log_fields", "test_full_disk", "test_gunicorn", "test_heartbeat", "test_install", "test_integration_browser",
        "test_key_rotation", "test_logs", "test_monitoring_site", "test_openapi_clients", "test_package", "test_paths",
        "test_pgbouncer", "test_primary_failover", "test_prometheus", "test_restore", "test_scale",
        "test_schemathesis_run", "test_serve", "test_store_outage", "test_systemd", "test_token_secrets", "test_upgrade",
        "test_upstream_keepalive", "test_webhook_client", "test_worker_boot",
    ),
    "system": (
        "test_admin_slow_clients", "test_app_failover", "test_examples", "test_standby", "test_store_network",
        "test_storm", "test_write_history",
    ),
}
ORDER = tuple(TIERS)
# The system tier runs in two lanes side by side, each one test at a time (scripts/test: pytest -m
# "system and lane_NAME"): the network faults, which mostly wait on cuts and bounds, in one; what drives
# a load or kills processes in the other.
SYSTEM_LANES: dict[str, tuple[str, ...]] = {"network": ("test_store_network", "test_standby")}
LANES = ("network", "load")  # "load": every other system-tier module
# The tiers whose tests run on both engines unless an ``engine`` marker pins one; elsewhere SQLite.
BOTH_ENGINES = ("store", "integration", "system")


def system_lane(module: str) -> str:
    """The lane of a system-tier module (its mark: lane_network or lane_load)."""
    return next((lane for lane, modules in SYSTEM_LANES.items() if module in modules), "load")


def tier_of(module: str) -> str | None:
    """The tier of a test module (its file name without .py), None if it is in none."""
    return next((tier for tier, modules in TIERS.items() if module in modules), None)
