"""The placeholder renderer, the log redaction filter, and what the shipped logs may hold."""

from __future__ import annotations

import logging
import os
import re
import runpy
from pathlib import Path

import pytest

from authsvc.deployment import PLACEHOLDER, RenderError, main, render_text, render_tree
from authsvc.serving.redact import RedactFilter, redact
from authsvc.settings import Settings

REPO = Path(__file__).resolve().parents[2]
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


def test_upstreams_give_one_server_line_each(rendered, tmp_path):
    """One local unix socket by default (SOCKET's); UPSTREAMS names more app hosts
    (docs/scaling.md)."""
    server = r"^\s*server (\S+) max_fails=1 fail_timeout=10s;"
    site = (rendered / "nginx/sites/authsvc.conf").read_text()
    assert re.findall(server, site, re.M) == ["unix:/run/authsvc.sock"]
    render_tree(str(REPO / "deploy"), str(tmp_path / "sock"), {**HOSTS, "SOCKET": "/run/x.sock"})
    assert re.findall(server, (tmp_path / "sock/nginx/sites/authsvc.conf").read_text(), re.M) == [
        "unix:/run/x.sock"
    ]
    hosts = "unix:/run/authsvc.sock 10.0.0.2:8000 [2001:db8::3]:8000"
    render_tree(str(REPO / "deploy"), str(tmp_path / "many"), {**HOSTS, "UPSTREAMS": hosts})
    site = (tmp_path / "many/nginx/sites/authsvc.conf").read_text()
    assert re.findall(server, site, re.M) == hosts.split()
    assert (
        "ListenStream=/run/authsvc.sock" in (tmp_path / "many/systemd/authsvc.socket").read_text()
    )
    # A list item cannot carry nginx syntax, and the list cannot be empty.
    for bad in ("10.0.0.2:8000; include /x", "10.0.0.2:8000 backup;", "   "):
        with pytest.raises(RenderError):
            render_tree(str(REPO / "deploy"), str(tmp_path / "bad"), {**HOSTS, "UPSTREAMS": bad})
    with pytest.raises(RenderError, match="HTTPS_LISTEN"):
        render_tree(str(REPO / "deploy"), str(tmp_path / "bad"), {**HOSTS, "HTTPS_LISTEN": "443 {"})


def test_proxy_retries_only_failures_before_an_answer(rendered):
    """An authentication is retried on the next app host on a connection error or timeout, POST
    included, never on an answer of the app (its 503 included), within the upstream timeout."""
    proxy = (rendered / "nginx/snippets/authsvc-proxy.conf").read_text()
    [next_upstream] = re.findall(r"^proxy_next_upstream ([^;]*);", proxy, re.M)
    assert next_upstream.split() == ["error", "timeout", "non_idempotent"]
    assert "proxy_next_upstream_tries 3;" in proxy
    assert "proxy_next_upstream_timeout 10s;" in proxy  # UPSTREAM_TIMEOUT's default
    assert "proxy_intercept_errors off;" in proxy


def test_missing_and_unused_values_stop_the_render(tmp_path):
    with pytest.raises(RenderError, match="@NOPE@"):
        render_text("a @NOPE@ b\n", {})
    with pytest.raises(RenderError, match="@API_HOTS@"):
        render_tree(str(REPO / "deploy"), str(tmp_path), {**HOSTS, "API_HOTS": "x"})
    with pytest.raises(RenderError, match="API_HOST and LEGACY_HOST"):
        render_tree(str(REPO / "deploy"), str(tmp_path), {"API_HOST": "a.example"})
    # A value that could inject nginx syntax is refused.
    with pytest.raises(RenderError, match="white space"):
        render_tree(
            str(REPO / "deploy"), str(tmp_path), {**HOSTS, "API_HOST": "a.example; include /x"}
        )
    assert main([str(REPO / "deploy"), str(tmp_path / "out"), "--set", "lower=1"]) == 1


def test_nginx_named_locations_are_not_placeholders():
    assert render_text("error_page 502 @authsvc_502;\n", {}) == "error_page 502 @authsvc_502;\n"


def test_nginx_access_log_format_never_holds_query_or_body(rendered):
    text = "\n".join(p.read_text() for p in (rendered / "nginx").rglob("*.conf"))
    formats = re.findall(r"log_format\s+\S+\s+((?:'[^']*'\s*)+);", text)
    assert formats, "no log_format found"
    for fmt in formats:
        for variable in (
            "$request ",
            '$request"',
            "$request_uri",
            "$args",
            "$arg_",
            "$query_string",
            "$http_referer",
            "$request_body",
            "$is_args",
        ):
            assert variable not in fmt + " ", variable
        # A route name, never $uri: a percent-encoded "?" puts the query string in it.
        # (The optional admin server's format names the admin API's routes: authsvc-admin.conf.)
        assert "$uri" not in fmt and ("$authsvc_route" in fmt or "$authsvc_admin_route" in fmt)
        assert "$request_method" in fmt and "$request_id" in fmt
    # Every access_log line uses that format (429 and 444 answers sampled).
    for line in re.findall(r"^\s*access_log\s+([^;]*);", text, re.M):
        # The monitoring server (/metrics, probes) leaves out its successful answers instead.
        assert line.split()[1:] in (
            ["authsvc_access", "if=$authsvc_log"],
            ["authsvc_access", "if=$authsvc_monitor_log"],
            ["authsvc_admin_access", "if=$authsvc_admin_log"],
        ), line


def test_gunicorn_config_keeps_queries_out_and_files_in(monkeypatch, tmp_path):
    monkeypatch.setenv(
        "PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics")
    )  # else the config sets one
    monkeypatch.setenv("AUTHSVC_WORKERS", "3")
    monkeypatch.setenv("AUTHSVC_WORKER_CLASS", "gthread")
    config = tmp_path / "authsvc.toml"
    config.write_text('[authsvc]\nlog_level = "warning"\n[gunicorn]\nworkers = 9\nthreads = 4\n')
    monkeypatch.setenv("AUTHSVC_CONFIG", str(config))
    conf = runpy.run_path(str(REPO / "deploy/gunicorn.conf.py"))
    assert (conf["workers"], conf["worker_class"], conf["threads"]) == (
        3,
        "authsvc.serving.workers.ThreadWorker",
        4,
    )  # env beats the file
    assert conf["logconfig_dict"]["loggers"]["authsvc"]["level"] == "WARNING"
    for atom in ("%(r)s", "%(q)s", "%(f)s", "%(a)s", "%({cookie}i)s"):
        assert atom not in conf["access_log_format"], atom
    assert "%(U)s" in conf["access_log_format"]  # a route name: authsvc/serving/access_log.py
    assert conf["logger_class"] == "authsvc.serving.access_log.RouteLogger"
    assert conf["control_socket_disable"] is True and conf["pidfile"] is None
    assert conf["preload_app"] is True  # a worker respawned in a store outage must not re-check it
    assert conf["forwarded_allow_ips"] == "127.0.0.1,::1"
    assert conf["secure_scheme_headers"] == {"X-FORWARDED-PROTO": "https"}
    assert conf["logconfig_dict"]["loggers"]["gunicorn.error"]["filters"] == ["redact"]
    monkeypatch.setenv("AUTHSVC_WORKER_CLASS", "gevent")
    with pytest.raises(SystemExit, match="AUTHSVC_WORKER_CLASS must be one of sync, gthread"):
        runpy.run_path(str(REPO / "deploy/gunicorn.conf.py"))


def _gunicorn_conf(monkeypatch, tmp_path, text: str | None, **env) -> dict:
    """deploy/gunicorn.conf.py as gunicorn runs it, with only the settings given here."""
    for name in (
        "AUTHSVC_WORKERS",
        "AUTHSVC_WORKER_CLASS",
        "AUTHSVC_THREADS",
        "AUTHSVC_TIMEOUT",
        "AUTHSVC_BIND",
        "AUTHSVC_LOG_LEVEL",
        "AUTHSVC_CONFIG",
        "AUTHSVC_METRICS_DIR_OWNED",
    ):
        monkeypatch.delenv(name, raising=False)
    # Else the config makes a metrics directory and sets the variable in this process for good.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    if text is not None:
        config = tmp_path / "authsvc.toml"
        config.write_text(text)
        monkeypatch.setenv("AUTHSVC_CONFIG", str(config))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(REPO / "deploy/gunicorn.conf.py"))


def test_gunicorn_config_reads_the_documented_layout(monkeypatch, tmp_path):
    """Top-level settings plus a [gunicorn] table: before, the app refused it and gunicorn ignored
    log_level."""
    conf = _gunicorn_conf(
        monkeypatch,
        tmp_path,
        'store = "sqlite:///srv/a.db"\nlog_level = "debug"\n'
        '[gunicorn]\nworkers = 3\nthreads = 2\ntimeout = 7\nbind = "127.0.0.1:8123"\n',
    )
    assert (conf["workers"], conf["threads"], conf["timeout"], conf["bind"]) == (
        3,
        2,
        7,
        ["127.0.0.1:8123"],
    )
    assert conf["worker_class"] == "authsvc.serving.workers.ThreadWorker"  # sync with threads > 1
    assert conf["logconfig_dict"]["loggers"]["authsvc"]["level"] == "DEBUG"
    defaults = _gunicorn_conf(monkeypatch, tmp_path, None)
    assert (
        defaults["workers"] == os.cpu_count()
        and defaults["timeout"] == 30
        and defaults["threads"] == 1
    )
    assert defaults["worker_class"] == "authsvc.serving.workers.SyncWorker"
    assert defaults["bind"] == ["unix:/run/authsvc.sock"]


@pytest.mark.parametrize(
    "text, env, words",
    [
        ("[gunicorn]\ntimout = 5\n", {}, ["[gunicorn] timout", "did you mean timeout"]),
        ("[gunicorn]\nworker = 8\n", {}, ["[gunicorn] worker"]),
        ('[authsvcc]\nstore = "sqlite:///srv/a.db"\n', {}, ["[authsvcc]"]),
        ("max_body_bytes = true\n", {}, ["max_body_bytes must be an integer"]),
        ("[gunicorn]\nworkers = 1.9\n", {}, ["[gunicorn] workers must be an integer"]),
        (
            "[gunicorn]\nworkers = 2\n",
            {"AUTHSVC_WORKERS": "0"},
            ["AUTHSVC_WORKERS must be at least 1"],
        ),
        ("[gunicorn\n", {}, ["not valid TOML"]),
        (
            None,
            {"AUTHSVC_CONFIG": "/nonexistent/authsvc.toml"},
            ["cannot read", "/nonexistent/authsvc.toml"],
        ),
    ],
)
def test_gunicorn_config_refuses_bad_settings_in_one_line(monkeypatch, tmp_path, text, env, words):
    with pytest.raises(SystemExit) as caught:
        _gunicorn_conf(monkeypatch, tmp_path, text, **env)
    message = str(caught.value.code)
    assert "\n" not in message and caught.value.code != 0, message
    for word in words:
        assert word in message, message
    if text is not None:
        assert str(tmp_path / "authsvc.toml") in message or "AUTHSVC_" in message, message


def _limits(rendered: Path) -> dict[str, str]:
    text = (rendered / "nginx/snippets/authsvc-limits.conf").read_text()
    return dict(re.findall(r"^(client_\w+)\s+([^;]+);", text, re.M))


def test_nginx_body_limit_is_the_service_setting(rendered, tmp_path):
    """nginx refuses a body exactly where the service would: the same number, the same default."""
    default = Settings(store="sqlite://x.db", token_secret_file="x").max_body_bytes
    limits = _limits(rendered)
    assert limits["client_max_body_size"] == limits["client_body_buffer_size"] == str(default)
    render_tree(str(REPO / "deploy"), str(tmp_path / "set"), {**HOSTS, "MAX_BODY_BYTES": "65536"})
    limits = _limits(tmp_path / "set")
    assert limits["client_max_body_size"] == limits["client_body_buffer_size"] == "65536"


def test_nginx_body_limit_from_the_settings_file(tmp_path):
    """--settings FILE: the limit comes from max_body_bytes there, and nowhere else."""
    config = tmp_path / "authsvc.toml"
    config.write_text(
        'store = "sqlite:///srv/a.db"\nmax_body_bytes = 40000\n[gunicorn]\nworkers = 2\n'
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                str(REPO / "deploy"),
                str(out),
                "--settings",
                str(config),
                "--set",
                "API_HOST=a.example",
                "--set",
                "LEGACY_HOST=b.example",
            ]
        )
        == 0
    )
    assert (
        _limits(out)["client_max_body_size"] == _limits(out)["client_body_buffer_size"] == "40000"
    )
    # Two sources for one number is what this removes: --set MAX_BODY_BYTES beside --settings is
    # refused.
    assert (
        main(
            [
                str(REPO / "deploy"),
                str(tmp_path / "o2"),
                "--settings",
                str(config),
                "--set",
                "MAX_BODY_BYTES=1",
                "--set",
                "API_HOST=a.example",
                "--set",
                "LEGACY_HOST=b.example",
            ]
        )
        == 1
    )
    # A bad settings file stops the render.
    config.write_text("max_body_bytes = true\n")
    assert (
        main(
            [
                str(REPO / "deploy"),
                str(tmp_path / "o3"),
                "--settings",
                str(config),
                "--set",
                "API_HOST=a.example",
                "--set",
                "LEGACY_HOST=b.example",
            ]
        )
        == 1
    )


def _upstream_headers(rendered: Path) -> list[str]:
    """The headers the API location's proxy snippet sets, the snippets it includes followed."""
    snippets = rendered / "nginx" / "snippets"
    text = (snippets / "authsvc-proxy.conf").read_text()
    text = re.sub(
        r"^include \S+/snippets/(\S+);$",
        lambda m: (snippets / m.group(1)).read_text(),
        text,
        flags=re.M,
    )
    return re.findall(r"^proxy_set_header (\S+) ", text, re.M)


def test_forwarded_headers_only_for_the_app_record(tmp_path):
    """X-Forwarded-For, X-Forwarded-Proto and X-Request-Id feed gunicorn's access line and the auth
    line (access_record = "app", the default); rendered with the shipped authsvc.toml ("edge":
    nginx's line is the record) none is sent, each a header less for gunicorn to parse."""
    forwarded = ["X-Forwarded-For", "X-Forwarded-Proto", "X-Request-Id"]
    render_tree(str(REPO / "deploy"), str(tmp_path / "default"), dict(HOSTS))
    assert _upstream_headers(tmp_path / "default") == [
        "Connection",
        "Content-Type",
        "Host",
        *forwarded,
        "X-Request-Start",
    ]
    sets = [arg for name, value in HOSTS.items() for arg in ("--set", f"{name}={value}")]
    shipped = REPO / "deploy" / "etc" / "authsvc.toml"
    assert (
        main([str(REPO / "deploy"), str(tmp_path / "shipped"), "--settings", str(shipped), *sets])
        == 0
    )
    assert _upstream_headers(tmp_path / "shipped") == [
        "Connection",
        "Content-Type",
        "Host",
        "X-Request-Start",
    ]
    config = tmp_path / "authsvc.toml"
    config.write_text('store = "sqlite:///srv/a.db"\naccess_record = "app"\n')
    assert (
        main([str(REPO / "deploy"), str(tmp_path / "app"), "--settings", str(config), *sets]) == 0
    )
    assert _upstream_headers(tmp_path / "app") == [
        "Connection",
        "Content-Type",
        "Host",
        *forwarded,
        "X-Request-Start",
    ]


def test_redact_removes_query_strings_and_quoted_request_data():
    key = "0f8e1c55-7d1b-4f9a-9a52-3c1b8f7e2d10"
    line = (
        "Invalid request from ip=: Invalid HTTP request line: 'GET "
        f"/api/authenticate.json?api_key={key} HTTP/1.1'"
    )
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


def _max_conns(rendered: Path) -> dict[str, list[str]]:
    """Each upstream block's name -> the max_conns of its server lines ("" where there is none)."""
    site = (rendered / "nginx/sites/authsvc.conf").read_text()
    blocks = re.findall(r"^upstream (\w+) \{(.*?)^\}", site, re.M | re.S)
    return {
        name: re.findall(r"^\s*server \S+ [^;]*?(?:max_conns=(\d+))?;", body, re.M)
        for name, body in blocks
    }


def test_upstream_max_conns_is_per_worker_and_never_limits_monitoring(rendered, tmp_path):
    """A login storm is shed past REQUESTS_PER_WORKER x the workers per app host
    (docs/operations.md, "Login storms"); probes and scrapes go through their own upstream, never
    limited."""
    from authsvc.deployment import REQUESTS_PER_WORKER

    cpus = os.cpu_count() or 1
    assert _max_conns(rendered) == {
        "authsvc_app": [str(REQUESTS_PER_WORKER * cpus)],
        "authsvc_monitor": [""],
    }
    config = tmp_path / "authsvc.toml"
    config.write_text('store = "sqlite:///srv/a.db"\n[gunicorn]\nworkers = 3\n')
    hosts = ["--set", "API_HOST=a.example", "--set", "LEGACY_HOST=b.example"]
    assert (
        main([str(REPO / "deploy"), str(tmp_path / "file"), "--settings", str(config), *hosts]) == 0
    )
    assert _max_conns(tmp_path / "file")["authsvc_app"] == [str(REQUESTS_PER_WORKER * 3)]
    # --set wins (app hosts with other worker counts), and holds for every host of UPSTREAMS.
    assert (
        main(
            [
                str(REPO / "deploy"),
                str(tmp_path / "set"),
                "--settings",
                str(config),
                *hosts,
                "--set",
                "UPSTREAM_MAX_CONNS=50",
                "--set",
                "UPSTREAMS=unix:/run/a.sock 10.0.0.2:8000",
            ]
        )
        == 0
    )
    assert _max_conns(tmp_path / "set") == {
        "authsvc_app": ["50", "50"],
        "authsvc_monitor": ["", ""],
    }
    monitoring = (tmp_path / "set/nginx/sites/authsvc.conf").read_text().split("server_name _;")[-1]
    assert "proxy_pass http://authsvc_monitor;" in monitoring and "authsvc_app" not in monitoring


def test_the_burst_let_through_at_once_is_never_zero():
    """nginx refuses "delay=0": an app host of one slot (UPSTREAM_MAX_CONNS=1) must still render a
    site nginx loads."""
    from authsvc.deployment import values_with_defaults

    assert values_with_defaults({"UPSTREAM_MAX_CONNS": "1"})["RATE_DELAY"] == "1"
