"""The placeholder renderer, the log redaction filter, and what the shipped logs may hold."""

from __future__ import annotations

import logging
import re
import runpy
from pathlib import Path

import pytest

from authsvc.deploy import PLACEHOLDER, RenderError, main, render_text, render_tree
from authsvc.logredact import RedactFilter, redact

REPO = Path(__file__).resolve().parent.parent
HOSTS = {"API_HOST": "api.example.com", "LEGACY_HOST": "legacy.example.com"}


@pytest.fixture
def rendered(tmp_path) -> Path:
    render_tree(str(REPO / "deploy"), str(tmp_path), dict(HOSTS))
    return tmp_path


def test_defaults_fill_every_placeholder(rendered):
    for path in rendered.rglob("*"):
        if path.is_file():
            assert not PLACEHOLDER.search(path.read_text()), path


def test_listen_lines_repeat_per_address(rendered):
    site = (rendered / "nginx/sites/authsvc.conf").read_text()
    assert re.findall(r"^\s*listen (\S+) ssl;", site, re.M) == ["443", "[::]:443"]
    assert "listen [::]:80 default_server;" in site
    assert "ssl_certificate     /etc/letsencrypt/live/api.example.com/fullchain.pem;" in site
    assert "return 301 https://api.example.com$request_uri;" in site


def test_missing_and_unused_values_stop_the_render(tmp_path):
    with pytest.raises(RenderError, match="@NOPE@"):
        render_text("a @NOPE@ b\n", {})
    with pytest.raises(RenderError, match="@API_HOTS@"):
        render_tree(str(REPO / "deploy"), str(tmp_path), {**HOSTS, "API_HOTS": "x"})
    with pytest.raises(RenderError, match="API_HOST and LEGACY_HOST"):
        render_tree(str(REPO / "deploy"), str(tmp_path), {"API_HOST": "a.example"})
    # A value that could inject nginx syntax is refused.
    with pytest.raises(RenderError, match="white space"):
        render_tree(str(REPO / "deploy"), str(tmp_path), {**HOSTS, "API_HOST": "a.example; include /x"})
    assert main([str(REPO / "deploy"), str(tmp_path / "out"), "--set", "lower=1"]) == 1


def test_nginx_named_locations_are_not_placeholders():
    assert render_text("error_page 502 @authsvc_502;\n", {}) == "error_page 502 @authsvc_502;\n"


def test_nginx_access_log_format_never_holds_query_or_body(rendered):
    text = "\n".join(p.read_text() for p in (rendered / "nginx").rglob("*.conf"))
    formats = re.findall(r"log_format\s+\S+\s+((?:'[^']*'\s*)+);", text)
    assert formats, "no log_format found"
    for fmt in formats:
        for variable in ("$request ", "$request\"", "$request_uri", "$args", "$arg_", "$query_string",
                         "$http_referer", "$request_body", "$is_args"):
            assert variable not in fmt + " ", variable
        # A route name, never $uri: a percent-encoded "?" puts the query string in it.
        assert "$uri" not in fmt and "$authsvc_route" in fmt
        assert "$request_method" in fmt and "$request_id" in fmt
    # Every access_log line uses that format (429 and 444 answers sampled).
    for line in re.findall(r"^\s*access_log\s+([^;]*);", text, re.M):
        # The monitoring server (/metrics, probes) leaves out its successful answers instead.
        assert line.split()[1:] in (["authsvc_access", "if=$authsvc_log"], ["authsvc_access", "if=$authsvc_monitor_log"]), line


def test_gunicorn_config_keeps_queries_out_and_files_in(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))  # else the config sets one
    monkeypatch.setenv("AUTHSVC_WORKERS", "3")
    monkeypatch.setenv("AUTHSVC_WORKER_CLASS", "gthread")
    config = tmp_path / "authsvc.toml"
    config.write_text('[authsvc]\nlog_level = "warning"\n[gunicorn]\nworkers = 9\nthreads = 4\n')
    monkeypatch.setenv("AUTHSVC_CONFIG", str(config))
    conf = runpy.run_path(str(REPO / "deploy/gunicorn.conf.py"))
    assert (conf["workers"], conf["worker_class"], conf["threads"]) == (
        3, "authsvc.gunicorn_workers.ThreadWorker", 4)  # env beats the file
    assert conf["logconfig_dict"]["loggers"]["authsvc"]["level"] == "WARNING"
    for atom in ("%(r)s", "%(q)s", "%(f)s", "%(a)s", "%({cookie}i)s"):
        assert atom not in conf["access_log_format"], atom
    assert "%(U)s" in conf["access_log_format"]  # a route name: authsvc/gunicorn_logging.py
    assert conf["logger_class"] == "authsvc.gunicorn_logging.RouteLogger"
    assert conf["control_socket_disable"] is True and conf["pidfile"] is None
    assert conf["preload_app"] is True  # a worker respawned in a store outage must not re-check it
    assert conf["forwarded_allow_ips"] == "127.0.0.1,::1"
    assert conf["secure_scheme_headers"] == {"X-FORWARDED-PROTO": "https"}
    assert conf["logconfig_dict"]["loggers"]["gunicorn.error"]["filters"] == ["redact"]
    monkeypatch.setenv("AUTHSVC_WORKER_CLASS", "gevent")
    with pytest.raises(SystemExit, match="sync or gthread"):
        runpy.run_path(str(REPO / "deploy/gunicorn.conf.py"))


def test_redact_removes_query_strings_and_quoted_request_data():
    key = "0f8e1c55-7d1b-4f9a-9a52-3c1b8f7e2d10"
    line = f"Invalid request from ip=: Invalid HTTP request line: 'GET /api/authenticate.json?api_key={key} HTTP/1.1'"
    assert redact(line) == "Invalid request from ip=: invalid request line (text withheld)"
    uri = f"Error handling request GET /api/authenticate.json?user_id=1&api_key={key}"
    assert redact(uri, frozenset({"/api/authenticate.json"})) == (
        "Error handling request GET /api/authenticate.json (text withheld)"
    )


def test_redact_filter_rewrites_messages_args_and_tracebacks():
    key = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    logger = logging.getLogger("test.redact")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep()
    logger.addHandler(handler)
    logger.addFilter(RedactFilter())
    logger.propagate = False
    try:
        logger.warning("Error handling request %s %s", "GET", f"/x?game_auth_token={key}")
        try:
            raise ValueError(f"bad header {key!r}")
        except ValueError:
            logger.exception("failed on %r", key)
    finally:
        logger.removeHandler(handler)
    assert len(records) == 2
    assert all(key not in r for r in records), records
    assert "ValueError" in records[1]


def test_install_script_and_wrapper_are_executable():
    for path in (REPO / "scripts/install", REPO / "deploy/bin/authsvc"):
        assert path.stat().st_mode & 0o111, path
