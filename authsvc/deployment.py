"""Fill the ``@NAME@`` placeholders of the files under ``deploy/``: the one way to render them.

``scripts/install`` and the tests both call this (``python -m authsvc.deployment``),
so the tests run exactly what a machine gets. Rules:

- a placeholder is ``@`` + upper-case letters, digits or ``_`` + ``@``
  (nginx named locations such as ``@authsvc_502`` are lower case, so never one);
- every placeholder in a template needs a value, and every value given must be
  used by some template: a typo stops the render instead of shipping ``@API_HOTS@``;
- a line holding a list placeholder (``*_LISTEN``, ``UPSTREAMS``, ``ADMIN_ALLOW``) is written once
  per space-separated item of its value (``443 [::]:443`` gives two ``listen``
  lines; ``unix:/run/authsvc.sock 10.0.0.2:8000`` two upstream ``server`` lines);
- ``MAX_BODY_BYTES`` (nginx's body limit) is the service's ``max_body_bytes``: from
  the settings file given with ``--settings`` (then ``--set MAX_BODY_BYTES`` is
  refused: one number, one source), else its declared default (authsvc/settings.py).
- ``ACCESS_RECORD`` is the service's ``access_record``, from the same settings file or its default
  (``app``): the proxy snippet includes ``authsvc-forwarded-<value>.conf``, which sends
  X-Forwarded-For, X-Forwarded-Proto and X-Request-Id only for ``app`` (with ``edge`` nothing reads
  them).
- ``UPSTREAM_MAX_CONNS`` (nginx's max_conns per app host) is REQUESTS_PER_WORKER x
  the ``[gunicorn] workers`` of that settings file, else of the declared default (this
  machine's CPUs); ``--set`` overrides it (app hosts with other worker counts).
- ``RATE_DELAY`` (how many requests of one address's burst nginx passes at once, the
  rest spaced at RATE: limit_req's ``delay=``) is half of UPSTREAM_MAX_CONNS, so one
  address's burst never fills an app host, and at most RATE_BURST; RATE_BURST when there
  is no max_conns (0).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from authsvc.errors import CommandError, Error
from authsvc.settings import default, read_settings

PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")

# What a machine gets when the installer is not told otherwise.
DEFAULTS = {
    "HTTPS_LISTEN": "443 [::]:443",
    "HTTP_LISTEN": "80 [::]:80",
    # The monitoring server (/metrics, /healthz, /readyz): loopback unless told otherwise.
    "METRICS_LISTEN": "127.0.0.1:9180",
    "SOCKET": "/run/authsvc.sock",
    # The admin API's unix socket (authsvc-admin.socket) and the group that may connect to it.
    "ADMIN_SOCKET": "/run/authsvc-admin.sock",
    "ADMIN_GROUP": "authsvc-admin",
    # The optional admin server of nginx (sites/authsvc-admin.conf, off by default): its own
    # TLS listen addresses and the client addresses it lets through (ADMIN_HOST: admin.API_HOST).
    "ADMIN_LISTEN": "127.0.0.1:8443",
    "ADMIN_ALLOW": "127.0.0.1 ::1",
    # UPSTREAMS (the app hosts nginx proxies to) defaults to "unix:" + SOCKET.
    "NGINX_DIR": "/etc/nginx",
    "NGINX_LOG_DIR": "/var/log/nginx",
    "NGINX_GROUP": "www-data",
    "ACME_ROOT": "/var/www/html",
    "RATE": "20r/s",
    "RATE_BURST": "40",
    # Requests in progress per client address (nginx limit_conn): above RATE_BURST.
    "CONN_LIMIT": "50",
    "UPSTREAM_TIMEOUT": "10s",
    # UPSTREAM_MAX_CONNS defaults to REQUESTS_PER_WORKER x the gunicorn workers.
    "APP_DIR": "/opt/authsvc",
    "CONF_DIR": "/etc/authsvc",
    "USER": "authsvc",
}
# Placeholders that are settings of the service, not of the deploy: name -> setting.
FROM_SETTINGS = {"MAX_BODY_BYTES": "max_body_bytes", "ACCESS_RECORD": "access_record"}
# Login storms (docs/operations.md, "Login storms"): nginx lets an app host hold this
# many requests per gunicorn worker (UPSTREAM_MAX_CONNS, nginx's max_conns); past it,
# the JSON 503 at once, at no cost to the workers. 40: a burst of 32 per worker arriving
# at once is queued and served, not shed (tests/system/test_storm.py), and a full queue's wait
# (40 x the time per request) stays far below AUTHSVC_MAX_QUEUE_WAIT, the app's shed of
# a request that waited too long (authsvc/web/queueing.py), which costs a worker as much as
# serving it: a deeper queue makes every request wait past it and throughput collapses
# (BENCHMARKS.md, "Login storm").
REQUESTS_PER_WORKER = 40


class RenderError(CommandError):
    """A placeholder without a value, or a value no template uses."""


def is_list(name: str) -> bool:
    """A placeholder whose line is repeated once per space-separated item of its value."""
    return name.endswith("_LISTEN") or name in ("UPSTREAMS", "ADMIN_ALLOW")


def values_with_defaults(given: dict[str, str]) -> dict[str, str]:
    """DEFAULTS, then derived values, then ``given`` (which wins)."""
    values = dict(DEFAULTS)
    values.update({name: str(default(setting)) for name, setting in FROM_SETTINGS.items()})
    values.update(given)
    api_host = values.get("API_HOST", "")
    values.setdefault("HTTPS_URL", f"https://{api_host}")
    values.setdefault("TLS_CERT", f"/etc/letsencrypt/live/{api_host}/fullchain.pem")
    values.setdefault("TLS_KEY", f"/etc/letsencrypt/live/{api_host}/privkey.pem")
    values.setdefault("UPSTREAMS", f"unix:{values['SOCKET']}")
    admin_host = values.setdefault("ADMIN_HOST", f"admin.{api_host}")
    values.setdefault("ADMIN_TLS_CERT", f"/etc/letsencrypt/live/{admin_host}/fullchain.pem")
    values.setdefault("ADMIN_TLS_KEY", f"/etc/letsencrypt/live/{admin_host}/privkey.pem")
    values.setdefault(
        "UPSTREAM_MAX_CONNS", str(REQUESTS_PER_WORKER * default("workers"))
    )  # this machine's CPUs
    if "RATE_DELAY" not in values:
        max_conns = (
            int(values["UPSTREAM_MAX_CONNS"]) if values["UPSTREAM_MAX_CONNS"].isdigit() else 0
        )
        burst = int(values["RATE_BURST"]) if values["RATE_BURST"].isdigit() else max_conns
        # At least 1: nginx refuses delay=0 (one slot per app host).
        values["RATE_DELAY"] = (
            str(max(1, min(max_conns // 2, burst))) if max_conns else values["RATE_BURST"]
        )
    for name, value in values.items():
        # A list's items are separated by spaces; no item may hold nginx syntax either.
        items = value.split(" ") if is_list(name) else [value]
        if "\n" in value or any(re.search(r"[\s;{}'\"]", item) for item in items if item):
            raise RenderError(
                f"value of @{name}@ must not hold white space, quotes, ';' or braces: {value!r}"
            )
        if is_list(name) and not value.split():
            raise RenderError(f"@{name}@ needs at least one item")
    return values


def render_text(text: str, values: dict[str, str], used: set[str] | None = None) -> str:
    """``text`` with every placeholder filled; names filled are added to ``used``."""
    out = []
    for line in text.splitlines(keepends=True):
        names = PLACEHOLDER.findall(line)
        missing = [n for n in names if n not in values]
        if missing:
            raise RenderError(f"no value for @{missing[0]}@ in: {line.strip()}")
        if used is not None:
            used.update(names)
        lists = [n for n in names if is_list(n)]
        variants: list[str | None] = list(values[lists[0]].split()) if lists else [None]
        for variant in variants:

            def fill(
                m: re.Match[str], variant: str | None = variant, lists: list[str] = lists
            ) -> str:
                return (
                    variant if variant is not None and m.group(1) in lists else values[m.group(1)]
                )

            out.append(PLACEHOLDER.sub(fill, line))
    return "".join(out)


def render_tree(src: str, dest: str, given: dict[str, str]) -> list[str]:
    """Render every file under ``src`` to the same relative path under ``dest``; returns the paths
    written."""
    values = values_with_defaults(given)
    if not values.get("API_HOST") or not values.get("LEGACY_HOST"):
        raise RenderError("API_HOST and LEGACY_HOST need values")
    used: set[str] = set()
    rendered: dict[str, str] = {}
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(
            d for d in dirs if d != "__pycache__"
        )  # left by a gunicorn run from deploy/
        for name in sorted(files):
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                rendered[os.path.relpath(path, src)] = render_text(f.read(), values, used)
    unused = sorted(set(given) - used)
    if unused:
        raise RenderError(f"no template uses @{unused[0]}@ (a typo?)")
    written = []
    for rel, text in rendered.items():
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        mode = os.stat(os.path.join(src, rel)).st_mode & 0o777
        os.chmod(target, mode)
        written.append(target)
    return written


def parse_assignments(items: list[str]) -> dict[str, str]:
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not PLACEHOLDER.fullmatch(f"@{name}@"):
            raise RenderError(f"--set takes NAME=VALUE with an upper-case NAME, got {item!r}")
        values[name] = value
    return values


def values_from_settings(path: str, given: dict[str, str]) -> dict[str, str]:
    """``given`` plus the FROM_SETTINGS placeholders read from the settings file at ``path``
    (checked whole)."""
    twice = sorted(set(given) & set(FROM_SETTINGS))
    if twice:
        raise RenderError(
            f"@{twice[0]}@ comes from {FROM_SETTINGS[twice[0]]} in {path}: set it there, not with "
            "--set"
        )
    settings = read_settings({"AUTHSVC_CONFIG": path})  # a bad file: its ConfigError, one line
    derived = {
        "UPSTREAM_MAX_CONNS": str(REQUESTS_PER_WORKER * settings["workers"])
    }  # --set still wins
    return {
        **derived,
        **given,
        **{name: str(settings[setting]) for name, setting in FROM_SETTINGS.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m authsvc.deployment",
        description="Render deploy/ templates: fill @NAME@ placeholders (see docs/operations.md).",
    )
    parser.add_argument("src", help="template directory (e.g. deploy/nginx)")
    parser.add_argument("dest", help="output directory")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a placeholder value"
    )
    parser.add_argument(
        "--settings",
        metavar="FILE",
        help="the service's settings file: fills MAX_BODY_BYTES and ACCESS_RECORD",
    )
    args = parser.parse_args(argv)
    try:
        given = parse_assignments(args.set)
        if args.settings:
            given = values_from_settings(args.settings, given)
        for path in render_tree(args.src, args.dest, given):
            print(path)
    except (Error, OSError) as e:
        print(f"authsvc.deployment: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
