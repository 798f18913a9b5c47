"""A real Prometheus (Debian's ``prometheus`` package) scraping a real gunicorn with two workers.

After a scripted mix of requests (every reason at least once, each on a new connection
so both workers answer), a PromQL query through Prometheus's HTTP API returns exactly the
scripted counts per game and reason. The shipped alert rules pass ``promtool check rules``
and load without error, and every query of the shipped Grafana dashboard evaluates without
error (deploy/monitoring/, docs/operations.md "Monitoring").

Skipped when Prometheus is not installed, failed under AUTHSVC_TEST_STRICT=1 (.ci/run installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from authsvc.tokens import api_key_digest, mint_token, new_api_key
from tests import factories
from tests.support import (
    free_port,
    skip_or_fail,
    start_gunicorn,
    until_both_workers_counted,
    wait_for_port,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(REPO, "deploy", "monitoring", "authsvc-rules.yml")
DASHBOARD = os.path.join(REPO, "deploy", "monitoring", "grafana-dashboard.json")
SQLITE_ONLY = pytest.mark.engine("sqlite")
PATH = "/api/authenticate.json"


def binary(name: str) -> str:
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if path is None:
        skip_or_fail(f"{name} is not installed (Debian: apt-get install prometheus)")
    return path


def test_promtool_check_rules():
    done = subprocess.run(
        [binary("promtool"), "check", "rules", RULES], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


# Series as `authsvc deliver` serves them (authsvc/webhooks/metrics.py), a minute apart: webhook 3's
# receiver is down from minute 0 (its oldest pending delivery ages, two deliveries given up at 20
# and 21 minutes), webhook 4 is healthy; the deliverer's scrape fails from minute 40.
DELIVERY_RULES_TEST = """
rule_files: [RULES]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'authsvc_webhook_oldest_pending_seconds{job="authsvc-deliver",
          instance="d1",webhook="3"}'
        values: '0+60x45'
      - series: 'authsvc_webhook_oldest_pending_seconds{job="authsvc-deliver",
          instance="d1",webhook="4"}'
        values: '0x45'
      - series: 'authsvc_webhook_deliveries{job="authsvc-deliver",instance="d1",
          webhook="3",state="failed"}'
        values: '0x19 1 2x25'
      - series: 'authsvc_webhook_deliveries{job="authsvc-deliver",instance="d1",
          webhook="4",state="failed"}'
        values: '5x45'
      - series: 'up{job="authsvc-deliver",instance="d1"}'
        values: '1x39 0x6'
      - series: 'up{job="authsvc",instance="a1"}'
        values: '1x45'
    alert_rule_test:
      - eval_time: 14m
        alertname: AuthsvcWebhookDeliveryStalled
        exp_alerts: []
      - eval_time: 21m
        alertname: AuthsvcWebhookDeliveryStalled
        exp_alerts:
          - exp_labels: {severity: warning, webhook: "3"}
            exp_annotations:
              summary: "Webhook 3: a delivery has waited 21m 0s"
              description: "authsvc webhook deliveries 3 --state pending shows the receiver's
                answers; once it answers, authsvc webhook retry 3 --all."
      - eval_time: 19m
        alertname: AuthsvcWebhookDeliveriesFailing
        exp_alerts: []
      - eval_time: 25m
        alertname: AuthsvcWebhookDeliveriesFailing
        exp_alerts:
          - exp_labels: {severity: warning, webhook: "3"}
            exp_annotations:
              summary: "Webhook 3: deliveries failed (given up) in the last 15 minutes"
              description: "authsvc webhook deliveries 3 --state failed says why;
                once the receiver answers, authsvc webhook retry 3 --all."
      - eval_time: 38m
        alertname: AuthsvcWebhookDeliveriesFailing
        exp_alerts: []
      - eval_time: 41m
        alertname: AuthsvcDelivererDown
        exp_alerts: []
      - eval_time: 43m
        alertname: AuthsvcDelivererDown
        exp_alerts:
          - exp_labels: {severity: critical, job: authsvc-deliver, instance: d1}
            exp_annotations:
              summary: "authsvc deliver cannot be scraped: webhook events are not delivered"
              description: "systemctl status authsvc-deliver; journalctl -u authsvc-deliver."
"""


def test_promtool_the_delivery_alerts_fire_when_a_receiver_is_down_and_when_the_deliverer_is(
    tmp_path,
):
    test = tmp_path / "delivery-rules-test.yml"
    test.write_text(DELIVERY_RULES_TEST.replace("RULES", json.dumps(RULES)))
    done = subprocess.run(
        [binary("promtool"), "test", "rules", str(test)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def promql(port: int, query: str) -> dict:
    status, body = http_get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", (query, body)
    return answer["data"]


def counts(port: int) -> dict[tuple[str, str], int]:
    data = promql(port, "sum by (game, result) (authsvc_authentications_total)")
    return {
        (r["metric"]["game"], r["metric"]["result"]): int(float(r["value"][1]))
        for r in data["result"]
        if float(r["value"][1])
    }


@pytest.fixture
def served(env, world, tmp_path):
    """gunicorn (shipped config, two sync workers) and Prometheus scraping it every second."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    prometheus = binary("prometheus")
    app_port, prom_port = free_port(), free_port()
    gunicorn = start_gunicorn(
        {**env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")},
        "--graceful-timeout",
        "5",
        port=app_port,
        workers=2,
        config=os.path.join(REPO, "deploy", "gunicorn.conf.py"),
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES}\n"
        "scrape_configs:\n  - job_name: authsvc\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{app_port}']\n"
    )
    prom = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),
        start_new_session=True,
    )
    try:
        wait_for_port(app_port)
        wait_for_port(prom_port, timeout=30)
        deadline = time.monotonic() + 30
        while http_get(prom_port, "/-/ready")[0] != 200:
            assert prom.poll() is None and time.monotonic() < deadline, (
                tmp_path / "prometheus.log"
            ).read_text()
            time.sleep(0.2)
        yield app_port, prom_port, gunicorn
    finally:
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        if gunicorn.poll() is None:
            gunicorn.send_signal(signal.SIGTERM)
            gunicorn.communicate(timeout=20)


def until(check, what: str, seconds: float = 30.0):
    """check() until it is truthy, at most ``seconds``; its last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, what
            return value
        time.sleep(0.5)


@SQLITE_ONLY
def test_prometheus_sees_the_exact_counts_of_both_workers(served, world, tmp_path):
    app_port, prom_port, gunicorn = served
    secret = world.settings.token_secrets[0]
    game = str(world.game_id)
    expected: dict[tuple[str, str], int] = {}

    def call(params: dict, key: tuple[str, str], times: int = 1, status: int = 200) -> None:
        for _ in range(times):
            got, _ = http_get(app_port, PATH + "?" + urllib.parse.urlencode(params))
            assert got == status, (key, got)
        expected[key] = expected.get(key, 0) + times

    for _ in range(2):  # a different count for each reason, and enough requests for both workers
        call(world.params(), (game, "success"), 3)
        call(world.params(api_key=None), ("none", "missing_parameters"), 1)
        call(world.params(user_id="07"), ("none", "malformed"), 2)
        call(world.params(api_key=new_api_key()), ("none", "unknown_key"), 4)
        call(
            world.params(
                user_id="4243", game_auth_token=mint_token(secret, world.game_id, 4243, 0)
            ),
            (game, "unknown_player"),
            1,
        )
        call(world.params(game_auth_token="0" * 64), (game, "wrong_token"), 5)
    factories.add_player(world.store, 4244, "dora")
    factories.set_player_enabled(world.store, 4244, False)
    call(
        world.params(user_id="4244", game_auth_token=mint_token(secret, world.game_id, 4244, 0)),
        (game, "player_disabled"),
        2,
    )
    go_id, go_key = world.add_game("Go")
    now = int(time.time())
    factories.add_api_key(
        world.store, go_id, api_key_digest(new_api_key()), now - 100, now - 10
    )  # Go's first key expired
    call(
        world.params(api_key=go_key, game_auth_token=mint_token(secret, go_id, world.user_id, 0)),
        (str(go_id), "expired_key"),
        3,
    )
    shogi_id, shogi_key = world.add_game("Shogi")
    factories.set_game_enabled(world.store, shogi_id, False)
    call(
        world.params(
            api_key=shogi_key, game_auth_token=mint_token(secret, shogi_id, world.user_id, 0)
        ),
        (str(shogi_id), "game_disabled"),
        1,
    )
    params = world.params()  # before the store goes: the admin connection would make a new file
    path = world.settings.store.removeprefix("sqlite://")
    world.store.close()
    os.rename(path, tmp_path / "moved.db")
    call(params, ("none", "store_unavailable"), 2, status=503)
    assert http_get(app_port, "/readyz")[0] == 503 and http_get(app_port, "/healthz")[0] == 200
    os.rename(tmp_path / "moved.db", path)
    assert until(lambda: http_get(app_port, "/readyz")[0] == 200, "/readyz back to 200")

    assert len(expected) == 10  # every reason
    expected[game, "success"] += until_both_workers_counted(
        app_port, world.params(), tmp_path / "metrics"
    )
    until(
        lambda: counts(prom_port) == expected,
        f"Prometheus's counts {counts(prom_port)} != {expected}",
    )
    for _ in range(3):  # and in the next scrapes too, whichever worker answers them
        time.sleep(1.1)
        assert counts(prom_port) == expected
    store_errors = promql(prom_port, "sum(authsvc_store_unavailable_total)")["result"]
    assert float(store_errors[0]["value"][1]) == 3  # two authentications and one /readyz

    gunicorn.send_signal(signal.SIGTERM)
    _, err = gunicorn.communicate(timeout=20)
    pids = set(re.findall(r"\[(\d+)\] \[INFO\] authsvc\.auth: auth ", err))
    assert len(pids) == 2, f"both workers answered: {pids}"
    assert world.api_key not in err


@SQLITE_ONLY
def test_rules_load_and_every_dashboard_query_evaluates(served, world):
    app_port, prom_port, _ = served
    http_get(app_port, PATH + "?" + urllib.parse.urlencode(world.params()))
    until(lambda: counts(prom_port), "a first scrape")
    time.sleep(2)  # the rules evaluate every second
    _, body = http_get(prom_port, "/api/v1/rules")
    rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in rules) == sorted(
        [
            "AuthsvcGameFailureRatioHigh",
            "AuthsvcStoreUnavailable",
            "AuthsvcServerErrors",
            "AuthsvcApiKeyExpiringSoon",
            "AuthsvcScrapeFailing",
            "AuthsvcWebhookDeliveriesFailing",
            "AuthsvcWebhookDeliveryStalled",
            "AuthsvcDelivererDown",
        ]
    )
    assert all(r["health"] != "err" for r in rules), rules
    assert not [r for r in rules if r["state"] != "inactive"], "no alert fires on a healthy service"

    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    for expr in exprs:
        query = expr.replace("$game", ".*")  # the dashboard's variable, "All"
        assert "$" not in query, query
        promql(prom_port, query)
    game_var = next(v for v in dashboard["templating"]["list"] if v["name"] == "game")
    metric = re.fullmatch(r"label_values\((\w+), game\)", game_var["definition"])[1]
    _, body = http_get(
        prom_port, "/api/v1/label/game/values?" + urllib.parse.urlencode({"match[]": metric})
    )
    assert str(world.game_id) in json.loads(body)["data"]
    up = promql(prom_port, 'up{job="authsvc"}')["result"]
    assert up and up[0]["value"][1] == "1"
