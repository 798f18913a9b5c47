"""/metrics under gunicorn while a worker is creating its metrics files (authsvc/metrics.py,
WorkerFiles): the scrape answers with every other worker's counts, never a 500.
"""

from __future__ import annotations

import os
import signal
import urllib.parse

import pytest

from tests.support import PATH, free_port, get_text, skip_or_fail, start_gunicorn, wait_for_port

pytestmark = pytest.mark.engine("sqlite")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_scrape_while_a_worker_creates_its_metrics_file(env, world, tmp_path):
    """prometheus_client creates a worker's file empty and sizes it a moment later (a worker killed
    in between leaves it empty for good): a scrape that finds such a file still answers, with
    every other worker's counts."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    metrics_dir = tmp_path / "metrics"
    env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    port = free_port()
    proc = start_gunicorn(env, "--graceful-timeout", "5", port=port, workers=1,
                          config=os.path.join(REPO, "deploy", "gunicorn.conf.py"))
    try:
        wait_for_port(port)
        assert get_text(port, PATH + "?" + urllib.parse.urlencode(world.params()))[0] == 200
        (metrics_dir / "counter_999999.db").touch()  # as MmapedDict leaves it between open and truncate
        status, text = get_text(port, "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert status == 200, text
    assert f'authsvc_authentications_total{{game="{world.game_id}",result="success"}} 1.0' in text
    assert "unhandled" not in err, err
