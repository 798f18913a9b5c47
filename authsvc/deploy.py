"""Fill the ``@NAME@`` placeholders of the files under ``deploy/``: the one way to render them.

``scripts/install`` and the tests both call this (``python -m authsvc.deploy``),
so the tests run exactly what a machine gets. Rules:

- a placeholder is ``@`` + upper-case letters, digits or ``_`` + ``@``
  (nginx named locations such as ``@authsvc_502`` are lower case, so never one);
- every placeholder in a template needs a value, and every value given must be
  used by some template: a typo stops the render instead of shipping ``@API_HOTS@``;
- a line holding a ``*_LISTEN`` placeholder is written once per space-separated
  address in its value (``443 [::]:443`` gives two ``listen`` lines).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")

# What a machine gets when the installer is not told otherwise.
DEFAULTS = {
    "HTTPS_LISTEN": "443 [::]:443",
    "HTTP_LISTEN": "80 [::]:80",
    # The monitoring server (/metrics, /healthz, /readyz): loopback unless told otherwise.
    "METRICS_LISTEN": "127.0.0.1:9180",
    "SOCKET": "/run/authsvc.sock",
    "NGINX_DIR": "/etc/nginx",
    "NGINX_LOG_DIR": "/var/log/nginx",
    "NGINX_GROUP": "www-data",
    "ACME_ROOT": "/var/www/html",
    "RATE": "20r/s",
    "RATE_BURST": "40",
    # Requests in progress per client address (nginx limit_conn): above RATE_BURST.
    "CONN_LIMIT": "50",
    "UPSTREAM_TIMEOUT": "10s",
    "APP_DIR": "/opt/authsvc",
    "CONF_DIR": "/etc/authsvc",
    "USER": "authsvc",
}


class RenderError(Exception):
    """A placeholder without a value, or a value no template uses."""


def values_with_defaults(given: dict[str, str]) -> dict[str, str]:
    """DEFAULTS, then derived values, then ``given`` (which wins)."""
    values = dict(DEFAULTS)
    values.update(given)
    api_host = values.get("API_HOST", "")
    values.setdefault("HTTPS_URL", f"https://{api_host}")
    values.setdefault("TLS_CERT", f"/etc/letsencrypt/live/{api_host}/fullchain.pem")
    values.setdefault("TLS_KEY", f"/etc/letsencrypt/live/{api_host}/privkey.pem")
    for name, value in values.items():
        if "\n" in value or (not name.endswith("_LISTEN") and re.search(r"[\s;{}'\"]", value)):
            raise RenderError(f"value of @{name}@ must not hold white space, quotes, ';' or braces: {value!r}")
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
        listen = [n for n in names if n.endswith("_LISTEN")]
        variants = values[listen[0]].split() if listen else [None]
        for variant in variants:
            out.append(
                PLACEHOLDER.sub(
                    lambda m, variant=variant, listen=listen: variant if m.group(1) in listen else values[m.group(1)], line
                )
            )
    return "".join(out)


def render_tree(src: str, dest: str, given: dict[str, str]) -> list[str]:
    """Render every file under ``src`` to the same relative path under ``dest``; returns the paths written."""
    values = values_with_defaults(given)
    if not values.get("API_HOST") or not values.get("LEGACY_HOST"):
        raise RenderError("API_HOST and LEGACY_HOST need values")
    used: set[str] = set()
    rendered: dict[str, str] = {}
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")  # left by a gunicorn run from deploy/
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m authsvc.deploy",
        description="Render deploy/ templates: fill @NAME@ placeholders (see docs/operations.md).",
    )
    parser.add_argument("src", help="template directory (e.g. deploy/nginx)")
    parser.add_argument("dest", help="output directory")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a placeholder value")
    args = parser.parse_args(argv)
    try:
        for path in render_tree(args.src, args.dest, parse_assignments(args.set)):
            print(path)
    except (RenderError, OSError) as e:
        print(f"authsvc.deploy: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
