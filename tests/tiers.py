"""The suite's tiers (README.md, "Test it"): each test module in one, marked by tests/conftest.py.

- unit: no I/O beyond a temporary file: parsers, rules, the repository's own rules.
- functional: the WSGI apps through WebTest and the admin command, on a SQLite store: the front
  doors are engine-blind (every statement is the store's), so PostgreSQL gets a smoke test of
  each door (tests/test_postgres_smoke.py) instead of a second copy of every file.
- store: the store contract, each engine's own behaviour, and what runs engine-specific SQL through
  a front door (the write path, the audit chain, the batch, export/import, API tokens): on both engines.
- integration: real gunicorn, nginx, PostgreSQL servers of their own, Chromium, on loopback.
- system: network faults, failover, storms, the install, the history under kill -9, benchmarks'
  harness: they need the machine to themselves, so they run after the others, one at a time.

``scripts/test --quick`` runs unit and functional; ``scripts/test`` runs the first four in parallel
(pytest-xdist), then system serially. A new test module must be placed here (tests/test_suite_rules.py).
"""

from __future__ import annotations

TIERS: dict[str, tuple[str, ...]] = {
    "unit": (
        "test_dependencies", "test_deploy_render", "test_docs_links", "test_drift", "test_gunicorn_config",
        "test_http", "test_layout", "test_loglines", "test_logredact", "test_metrics_values", "test_repo_rules",
        "test_settings", "test_suite_rules", "test_tokens",
    ),
    "functional": (
        "test_admin_api", "test_admin_edges", "test_admin_openapi", "test_backup", "test_boundary",
        "test_check", "test_cli", "test_endpoint", "test_equal_work", "test_explain", "test_hostile",
        "test_metrics", "test_minted_after_a_change", "test_openapi", "test_postgres_smoke", "test_probes",
        "test_queueing", "test_reasons", "test_sqlite_faults", "test_staleness", "test_store_sqlite",
        "test_store_urls", "test_webhooks_api", "test_wsgi",
    ),
    "store": (
        "test_admin_batch", "test_api_tokens", "test_audit", "test_audit_anchor", "test_deliver", "test_erasure",
        "test_events",
        "test_postgres_deploy", "test_postgres_store", "test_snapshot_lock", "test_store_contract",
        "test_store_replaced", "test_transfer", "test_wal", "test_write_path",
    ),
    "integration": (
        "test_admin_api_examples", "test_admin_api_gunicorn", "test_admin_serving", "test_deliver_process", "test_deploy",
        "test_edge", "test_forged_log_fields", "test_gunicorn", "test_heartbeat", "test_integration_browser",
        "test_logs", "test_monitoring_site", "test_openapi_clients", "test_paths", "test_pgbouncer",
        "test_prometheus", "test_schemathesis_run", "test_serve", "test_systemd", "test_upstream_keepalive",
        "test_webhook_client",
        "test_worker_boot",
    ),
    "system": (
        "test_admin_cost", "test_admin_slow_clients", "test_app_failover", "test_bench", "test_examples",
        "test_install", "test_primary_failover", "test_scale", "test_standby", "test_store_network",
        "test_store_outage", "test_storm", "test_write_history",
    ),
}
ORDER = tuple(TIERS)
# The tiers whose tests run on both engines unless an ``engine`` marker pins one; elsewhere SQLite.
BOTH_ENGINES = ("store", "integration", "system")


def tier_of(module: str) -> str | None:
    """The tier of a test module (its file name without .py), None if it is in none."""
    return next((tier for tier, modules in TIERS.items() if module in modules), None)
