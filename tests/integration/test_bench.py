"""scripts/bench's harness: it runs end to end, and it refuses to time a server that answers
wrongly.

Not a timed test: the figures are BENCHMARKS.md's business. This only keeps the
harness working (a smoke run with tiny settings) and its guard honest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import wsgiref.simple_server
from pathlib import Path

import pytest

from authsvc.deployment import REQUESTS_PER_WORKER
from benchmarks import bare, bench
from benchmarks.bench.sections import SECTIONS, storm
from tests.support import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


class QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args):  # the request line holds the query string
        pass


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return bench.make_world(tmp_path_factory.mktemp("bench") / "world", players=50)


def serve_in_thread(app):
    server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


def test_a_server_that_answers_wrongly_is_refused_before_it_is_timed(world):
    """The bare app answers every request with success: as an endpoint it must fail the 403/400
    checks."""
    server = serve_in_thread(bare.application)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        bench.check_answers(bench.Server("bare", "bare", url), world)  # as itself: fine
        with pytest.raises(SystemExit, match="expected"):
            bench.check_answers(bench.Server("impostor", "endpoint", url), world)
    finally:
        server.shutdown()
        server.server_close()


def test_the_real_app_passes_the_checks(world):
    from authsvc.settings import Settings
    from authsvc.web.app import make_app

    server = serve_in_thread(make_app(Settings.from_env(world.env)))
    try:
        bench.check_answers(
            bench.Server("authsvc", "endpoint", f"http://127.0.0.1:{server.server_port}"),
            world,
            sample=10,
        )
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_shipped_path_runs_with_the_shipped_settings_file(world):
    """The sections that run the shipped path (nginx, gap, capacity, storm) give gunicorn the
    shipped authsvc.toml, as the unit does: access_record = "edge", nginx's line the one record; the
    world's store and secret beat the file."""
    import tomllib

    from authsvc.settings import Settings
    from benchmarks.bench.world import SHIPPED_ENV, SHIPPED_SETTINGS

    shipped = tomllib.loads(SHIPPED_SETTINGS.read_text())
    settings = Settings.from_env({**SHIPPED_ENV, **world.env})
    assert settings.access_record == shipped["access_record"] == "edge"
    assert settings.token_secrets[0] == world.secret


def test_smoke_run_of_the_core_section():
    if shutil.which("wrk") is None:
        skip_or_fail("wrk is not installed (Debian: apt-get install wrk)")
    try:
        import flask  # noqa: F401
    except ImportError:
        skip_or_fail(
            "Flask is not installed (benchmarks/requirements.txt; scripts/test installs it)"
        )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "core",
            "--duration",
            "1",
            "--rounds",
            "1",
            "--players",
            "2000",
            "--calls",
            "500",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wrk_table = done.stdout.split("In-process cost")[0]
    rows = {
        line.split("|")[1].strip(): line.split("|")
        for line in wrk_table.splitlines()
        if line.startswith("| ")
    }
    for name in ("bare", "plain", "authsvc", "flask"):
        assert name in rows, done.stdout
        assert int(float(rows[name][2].replace(",", ""))) > 0  # req/s
        assert rows[name][5].strip() == "0"  # errors
        assert float(rows[name][7]) > 0  # the workers' CPU time per request, from /proc
    assert "Targets: authsvc/bare" in done.stdout


def run_storm_section(*options: str) -> subprocess.CompletedProcess:
    """scripts/bench --only storm with a tiny store, one round and these options; it must
    succeed."""
    if shutil.which("wrk") is None:
        skip_or_fail("wrk is not installed (Debian: apt-get install wrk)")
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        skip_or_fail("nginx is not installed (Debian: apt-get install nginx)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "storm",
            "--players",
            "500",
            "--rounds",
            "1",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.slow
def test_smoke_run_of_the_storm_section():
    """A tiny storm (200 clients for 2 s) through the shipped nginx site, with and without the
    upstream limit, pinned as by default (wrk on one half of the CPUs, the server on the other);
    then nginx's CPU per shed 503, the shipped site against one logging every shed answer."""
    done = run_storm_section(
        "--storm-connections",
        "200",
        "--storm-seconds",
        "2",
        "--storm-capacity-seconds",
        "1",
        "--storm-shed-seconds",
        "1",
    )
    table = done.stdout.split("10. Login storm", 1)[1]
    rows = {
        line.split("|")[1].strip().split(" (")[0]: [c.strip() for c in line.split("|")[2:-1]]
        for line in table.split("The clients' view")[0].splitlines()
        if line.startswith("| UPSTREAM")
    }
    pin = storm.pinning("auto")
    shipped = REQUESTS_PER_WORKER * storm.server_workers(
        pin
    )  # one worker per CPU the server runs on
    assert set(rows) == {f"UPSTREAM_MAX_CONNS={shipped}", "UPSTREAM_MAX_CONNS=0"}, done.stdout
    assert ("Pinned: wrk, the probe and the bench on CPU" if pin else "Not pinned") in table, table
    for cells in rows.values():
        assert int(cells[2].replace(",", "")) > 0  # authentications served
        shed_ok, _, shed = cells[6].split(" (")[0].split(" ")[:3]
        assert shed_ok == shed  # every 503 the service's JSON with Retry-After
    view = table.split("The clients' view")[1].split("The capacity search")[0]
    views = [line.split("|") for line in view.splitlines() if line.startswith("| UPSTREAM")]
    assert [cells[8].strip() for cells in views] == ["0", "0"]  # no HTML answer
    cost = table.split("nginx's CPU per shed answer")[1]
    costs = {
        line.split("|")[1].strip().split(":")[0]: [c.strip() for c in line.split("|")[2:-1]]
        for line in cost.splitlines()
        if line.startswith("| ") and "---" not in line and "nginx site" not in line
    }
    assert set(costs) == {"shipped", "every shed 503 logged (the site before)"}, cost
    for cells in costs.values():
        assert (
            int(cells[0].replace(",", "")) > 0 and cells[4] == "0"
        )  # shed answers, each the JSON 503
    assert float(costs["shipped"][3]) < 100  # lines per 1,000 shed answers: one in 100 logged
    assert float(costs["every shed 503 logged (the site before)"][3]) >= 999


@pytest.mark.slow
def test_the_shed_cost_table_runs_alone_with_the_candidates():
    """--storm-max-conns '' runs no storm, only nginx's CPU per shed 503; --storm-shed-variants all
    adds the candidates for a cheaper shed answer (none shipped): each site's edit applies, nginx
    takes it, and every answer is still the service's JSON 503 with Retry-After."""
    done = run_storm_section(
        "--storm-max-conns", "", "--storm-shed-variants", "all", "--storm-shed-seconds", "1"
    )
    assert "10. Login storm" not in done.stdout  # no storm ran
    cost = done.stdout.split("nginx's CPU per shed answer")[1]
    costs = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in cost.splitlines()
        if line.startswith("| ") and "---" not in line and "nginx site" not in line
    }
    assert list(costs) == [label for label, _ in storm.SHED_VARIANTS + storm.SHED_CANDIDATES], cost
    for cells in costs.values():
        assert int(cells[0].replace(",", "")) > 0 and cells[4] == "0", (
            cost
        )  # shed answers, each the JSON 503
    assert float(costs["candidate: limit_conn shed (logged 1 in 100)"][3]) < 100, cost
    assert float(costs["candidate: shed 503s not logged at all"][3]) == 0, cost
    assert float(costs["floor: return 503 in the API location, access_log off"][3]) == 0, cost


@pytest.mark.slow
def test_a_storm_per_factor_and_the_experiments_options():
    """--storm-factor 1,3 runs a storm per factor, each its own row; --storm-nginx-policy batch runs
    the storm's nginx as SCHED_BATCH and says so in the row; --storm-shed-rate paces the shed-cost
    table's clients."""
    done = run_storm_section(
        "--storm-connections",
        "200",
        "--storm-seconds",
        "2",
        "--storm-capacity-seconds",
        "1",
        "--storm-shed-seconds",
        "1",
        "--storm-max-conns",
        "shipped",
        "--storm-factor",
        "1,3",
        "--storm-nginx-policy",
        "batch",
        "--storm-shed-rate",
        "2000",
    )
    table = done.stdout.split("10. Login storm", 1)[1].split("The clients' view")[0]
    labels = [
        line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| UPSTREAM")
    ]
    assert len(labels) == 2 and all("nginx SCHED_BATCH" in label for label in labels), table
    assert [label.rsplit(", ", 1)[1] for label in labels] == ["1 x capacity", "3 x capacity"], (
        labels
    )
    assert "offering 1, 3 x the capacity" in table
    offered = [
        float(line.split("|")[3].split("(")[1].rstrip(") "))
        for line in table.splitlines()
        if line.startswith("| UPSTREAM")
    ]
    # answers/s as a multiple of the capacity: the storms differ (3 x offered; a loaded machine
    # serves less of it)
    assert offered[1] > 1.3 * offered[0], offered
    assert "paced clients offering 2,000 req/s in all" in done.stdout


@pytest.mark.parametrize(("text", "factors"), [("4", [4.0]), ("1,1.5, 4", [1.0, 1.5, 4.0])])
def test_storm_factors_read_one_or_a_list(text, factors):
    assert storm.storm_factors(text) == factors


@pytest.mark.parametrize("text", ["", "4,", "four", "0", "-1", "inf", "nan"])
def test_storm_factors_refuse_what_is_not_a_positive_multiple(text):
    with pytest.raises(SystemExit, match="--storm-factor"):
        storm.storm_factors(text)


def test_the_sections_table_is_the_help_and_the_only_choices():
    """scripts/bench --help lists every section of the table; --only refuses any other name."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    listed = [
        line.split()[0]
        for line in done.stdout.split("sections:\n", 1)[1].splitlines()
        if line.startswith("  ") and not line.startswith("   ")
    ]
    assert (
        listed
        == list(SECTIONS)
        == [
            "core",
            "nginx",
            "gap",
            "postgres",
            "scale",
            "profile",
            "cold",
            "bodies",
            "metrics",
            "capacity",
            "storm",
            "admin-sync",
            "admin-load",
            "admin-cost",
            "events",
            "events-cost",
            "events-fair",
        ]
    )
    refused = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--only", "core,warp"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert refused.returncode == 2 and "unknown section(s): warp" in refused.stderr


def test_smoke_run_of_the_scale_section_on_both_engines(pg_server_url):
    """The scale section (with store-scale's per-engine table folded in) on tiny stores."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "scale",
            "--players",
            "300",
            "--scale-players",
            "600",
            "--calls",
            "50",
            "--scale-sizes",
            "200",
            "--auths",
            "100",
            "--pg",
            pg_server_url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [
        line.split("|")[1:-1]
        for line in done.stdout.splitlines()
        if line.startswith("| sqlite") or line.startswith("| postgresql")
    ]
    assert [row[:2] for row in rows] == [[" sqlite ", " 200 "], [" postgresql ", " 200 "]], (
        done.stdout
    )
    assert all(float(cell) > 0 for row in rows for cell in row[3:]), done.stdout


def test_smoke_run_of_the_metrics_section():
    """Metrics on against off, in process (no wrk), after a section that already imported
    prometheus_client."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "cold,metrics",
            "--players",
            "200",
            "--calls",
            "100",
            "--cold-calls",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        line.split("|")[1].strip(): line.split("|")
        for line in done.stdout.split("8. Metrics cost", 1)[1].splitlines()
        if line.startswith("| ")
    }
    assert (
        float(rows["authsvc, metrics off"][2]) > 0 and float(rows["authsvc, metrics on"][2]) > 0
    ), done.stdout
    assert "Target: metrics on within 3 µs of metrics off" in done.stdout


def test_smoke_run_of_the_events_section():
    """One deliverer against the receiver process: every figure of the table is there and
    positive."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "events",
            "--players",
            "50",
            "--events-burst",
            "200",
            "--events-changes",
            "20",
            "--events-pending",
            "500",
            "--events-down",
            "1",
            "--events-drain",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("## 12. Webhook delivery", 1)[1]
    rows = [
        line.split("|")[2].strip()
        for line in table.splitlines()
        if line.startswith("| ") and "measure" not in line
    ]
    assert len(rows) == 4 and "not all delivered" not in table, table
    assert (
        rows[0].endswith(" events/s") and rows[1].startswith("p50 ") and rows[2].endswith(" MB")
    ), table


def test_smoke_run_of_the_events_fair_section():
    """A healthy webhook alone and beside a blackholed one: both rows there, each with its p50 and
    p99."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "events-fair",
            "--players",
            "50",
            "--events-changes",
            "20",
            "--events-fair-pending",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("## Webhook delivery beside a blackholed receiver", 1)[1]
    rows = [
        line.split("|")[1:3]
        for line in table.splitlines()
        if line.startswith("| ") and "healthy" not in line
    ]
    assert [r[0].strip().split(" ")[0] for r in rows] == ["alone", "beside"], table
    assert all(r[1].strip().startswith("p50 ") and "(20 events)" in r[1] for r in rows), table


def test_smoke_run_of_the_events_cost_section():
    """The sync with and without a webhook, then the fan-out, wrk alone and beside a deliverer whose
    backlog outlasts the run: every ratio and rate is there and positive."""
    if shutil.which("wrk") is None:
        skip_or_fail("wrk is not installed (Debian: apt-get install wrk)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "events-cost",
            "--players",
            "200",
            "--rounds",
            "1",
            "--duration",
            "1",
            "--connections",
            "4",
            "--sync-engines",
            "sqlite",
            "--sync-clients",
            "1",
            "--events-cost-players",
            "2000",
            "--events-cost-backlog",
            "3000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("## 15. Events on", 1)[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| measure")
    }
    assert list(rows) == [
        "admin sync, sqlite: players/s",
        "then the deliverer's fan-out, sqlite: deliveries/s",
        "authentication req/s",
        "authentication p99 ms",
        "deliveries/s during the runs; backlog left at the end",
    ], table
    for name in ("admin sync, sqlite: players/s", "authentication req/s"):
        assert float(rows[name][2].strip("*")) > 0, table
    assert (
        float(rows["then the deliverer's fan-out, sqlite: deliveries/s"][1].replace(",", "")) > 0
    ), table
    assert "ran out" not in table, table


@pytest.mark.slow
def test_smoke_run_of_the_capacity_section():
    """Every configuration serves, and each process kind that serves it shows CPU time per
    authentication."""
    from harness.pgserver import find_bin_dir, find_pgbouncer
    from harness.processes import find_nginx

    missing = [
        name
        for name, found in (
            ("wrk", shutil.which("wrk")),
            ("nginx", find_nginx()),
            ("the PostgreSQL server binaries", find_bin_dir()),
            ("pgbouncer", find_pgbouncer()),
        )
        if found is None
    ]
    if missing:
        skip_or_fail(f"the capacity section needs {', '.join(missing)}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "capacity",
            "--players",
            "300",
            "--rounds",
            "1",
            "--capacity-seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("9. Capacity per core", 1)[1].split("Per component", 1)[0]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| configuration")
    }
    # label: which of app workers, PostgreSQL, pgbouncer, nginx took part, and PostgreSQL server
    # connections
    expected = {
        "SQLite": ("1000", "-"),
        "PostgreSQL, direct": ("1100", "2"),  # one per worker
        "PostgreSQL, pgbouncer (transaction, pool 1)": ("1110", "1"),  # both workers through one
        "PostgreSQL, hot standby, direct": ("1100", "2"),
        "SQLite, nginx (plain HTTP)": ("1001", "-"),
        "SQLite, nginx (HTTPS, kept alive)": ("1001", "-"),
        "PostgreSQL, direct, nginx (HTTPS, kept alive)": ("1101", "2"),
        "PostgreSQL, pgbouncer (transaction, pool 1), nginx (HTTPS, kept alive)": ("1111", "1"),
    }
    assert list(rows) == list(expected), done.stdout
    for label, (parts, connections) in expected.items():
        auths, rps, errors, *cpu, total, ratio, per_core, pg_connections = rows[label]
        assert int(auths.replace(",", "")) > 0 and errors == "0", (label, rows[label])
        assert "".join("0" if c == "-" else "1" for c in cpu) == parts, (label, rows[label])
        assert all(float(c) > 0 for c in cpu if c != "-"), (label, rows[label])
        assert float(total) == pytest.approx(sum(float(c) for c in cpu if c != "-"), abs=2), (
            label,
            rows[label],
        )
        assert float(per_core.replace(",", "")) > 0 and pg_connections == connections, (
            label,
            rows[label],
        )
        # The ratio column is this row's total over the SQLite row's (both printed rounded to 1 µs).
        reference = float(rows["SQLite"][-4])
        rounding = (0.5 / float(total) + 0.5 / reference) * float(total) / reference + 0.01
        assert float(ratio) == pytest.approx(float(total) / reference, abs=rounding), (
            label,
            rows[label],
        )
    assert re.search(
        r"The staleness check alone, on the standby: .* \d+\.\d µs with the check, \d+\.\d µs "
        r"without",
        done.stdout,
    ), done.stdout
    assert re.search(
        r"the primary spends \d+\.\d\d % of a core .* the heartbeat writer \d+\.\d\d %", done.stdout
    ), done.stdout


@pytest.mark.slow
def test_smoke_run_of_the_nginx_section_answers_every_request():
    """Section 2 measures throughput through the shipped site: its limits must not turn the load
    into 503s."""
    from harness.processes import find_nginx

    if shutil.which("wrk") is None or find_nginx() is None:
        skip_or_fail("the nginx section needs wrk and nginx")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "nginx",
            "--players",
            "300",
            "--rounds",
            "1",
            "--duration",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [
        line.split("|")
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| server")
    ]
    assert len(rows) == 10, done.stdout  # five configurations, plain HTTP and HTTPS
    assert [row[5].strip() for row in rows] == ["0"] * 10, (
        done.stdout
    )  # errors: non-2xx answers included


def test_smoke_run_of_the_admin_sync_section_on_both_engines(pg_server_url):
    """A small sync (2,500 players: two full batches and a short one) through the admin service
    under gunicorn."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "admin-sync",
            "--players",
            "50",
            "--sync-players",
            "2500",
            "--sync-clients",
            "2",
            "--pg",
            pg_server_url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in done.stdout.split("11. Admin API", 1)[1].splitlines()
        if line.startswith("| sqlite") or line.startswith("| postgresql")
    ]
    assert [row[:3] for row in rows] == [
        [engine, "2,500", "3"]
        for engine in (
            "sqlite",
            "sqlite, Idempotency-Key",
            "postgresql",
            "postgresql, Idempotency-Key",
        )
    ], done.stdout
    assert all(float(row[4].replace(",", "")) > 0 for row in rows), (
        done.stdout
    )  # players per second


@pytest.mark.slow
def test_smoke_run_of_the_admin_load_section():
    """wrk on the game-facing service alone and while the admin service syncs players into the same
    store, at normal and at the unit's low priority, with a revoke mid-run whose promise held."""
    if shutil.which("wrk") is None:
        skip_or_fail("wrk is not installed (Debian: apt-get install wrk)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "admin-load",
            "--players",
            "500",
            "--rounds",
            "1",
            "--duration",
            "1",
            "--sync-clients",
            "1",
            "--sync-engines",
            "sqlite",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("12. Authentication under admin load", 1)[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| sqlite, ")
    }
    assert list(rows) == [
        "sqlite, alone",
        "sqlite, with the sync",
        "sqlite, with the sync, admin at low priority",
    ], done.stdout
    for cells in rows.values():
        assert float(cells[0].replace(",", "")) > 0 and cells[3] == "0", (
            done.stdout
        )  # req/s, no errors
        assert cells[-1] == "yes (1 of 1)", (
            done.stdout
        )  # no authentication after effective_by took the old token
    for label in ("sqlite, with the sync", "sqlite, with the sync, admin at low priority"):
        assert float(rows[label][4].replace(",", "")) > 0, done.stdout  # players synced a second
    assert "nice -n 10" in table, done.stdout  # the unit's Nice=, read from deploy/systemd


def test_smoke_run_of_the_admin_cost_section():
    """Another token's GETs alone and beside the costliest bodies of one token, under the admin
    service as shipped: every GET answered, the costly token both served and held back, the ratio
    row printed."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "admin-cost",
            "--players",
            "100",
            "--cost-rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("## admin-cost", 1)[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| another")
    }
    assert list(rows) == ["alone", "during", "during / alone"], done.stdout
    assert int(rows["alone"][2]) > 10 and int(rows["during"][2]) > 10, (
        done.stdout
    )  # GETs in each half
    assert float(rows["during / alone"][1]) > 0, done.stdout
    answers = table.split("the costly token's answers: ", 1)[1].split(";", 1)[0]
    assert "200:" in answers and "429:" in answers, done.stdout  # served, and held back by its rate


def test_the_storm_pins_client_and_server_apart_or_says_it_cannot(monkeypatch, capsys):
    """Half the CPUs for wrk, the rest for nginx and gunicorn; with one CPU, unpinned and said
    so."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert storm.pinning("auto") == storm.Pinning(frozenset({0, 1}), frozenset({2, 3}))
    assert storm.pinning("off") is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 1})
    assert storm.pinning("auto") == storm.Pinning(frozenset({1}), frozenset({5}))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert storm.pinning("auto") is None
    assert "only CPU 3 is available to this process: NOT pinned" in capsys.readouterr().err


def test_the_gap_sections_other_checkout_must_be_one(tmp_path):
    """--gap-against names a checkout whose own gap section runs the same rows; any other directory
    stops the run with a line that says so, before anything is measured."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench",
            "--only",
            "gap",
            "--players",
            "10",
            "--gap-against",
            str(tmp_path),
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode != 0
    assert (
        f"bench: gap: {tmp_path} is not a checkout of authsvc with a gap section" in result.stderr
    )
