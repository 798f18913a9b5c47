"""The nginx admin site's route map against the admin API's route table.

nginx's access line for the admin API names a request's route, not its path (deploy/nginx/sites/
authsvc-admin.conf, ``map $uri $authsvc_admin_route``; docs/logs.md): a route missing from that
map is logged as "<other>", and an operator reading the log cannot tell a webhook retry from a
scan. The map is read from the shipped file and each of its entries applied as nginx applies them
(exact strings first, then the regular expressions in order); every route of authsvc/api/routes.py
must come out as its own template, and the map must name no route the API does not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from authsvc.api import (
    app,  # noqa: F401  (registers the routes)
    routes,
)

SITE = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "sites" / "authsvc-admin.conf"
_ENTRY = re.compile(r'^\s*("[^"]*"|\S+)\s+("[^"]*"|\S+);\s*$')


def route_map() -> tuple[dict[str, str], list[tuple[re.Pattern, str]], str]:
    """(exact entries, regular-expression entries in order, default) of ``map $uri
    $authsvc_admin_route``."""
    text = SITE.read_text()
    block = re.search(r"map \$uri \$authsvc_admin_route \{\n(.*?)\n\}", text, re.S)
    assert block, "no route map in the admin site"
    exact: dict[str, str] = {}
    regexes: list[tuple[re.Pattern, str]] = []
    default = ""
    for line in block.group(1).splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        entry = _ENTRY.match(line)
        assert entry, line
        key, value = (part.strip('"') for part in entry.groups())
        if key == "default":
            default = value
        elif key.startswith("~"):
            regexes.append((re.compile(key[1:]), value))
        else:
            exact[key] = value
    return exact, regexes, default


def name_of(uri: str) -> str:
    """What nginx's map gives for ``uri``."""
    exact, regexes, default = route_map()
    if uri in exact:
        return exact[uri]
    return next((value for pattern, value in regexes if pattern.search(uri)), default)


def example(pattern: re.Pattern) -> str:
    """A path the route answers: each id in it 42."""
    return re.sub(r"\(\?P<\w+>[^)]*\)", "42", pattern.pattern)


ROUTES = [pattern for pattern, _ in routes._ROUTES]


@pytest.mark.parametrize("pattern", ROUTES, ids=lambda p: routes.template(p))
def test_every_admin_route_has_its_name_in_the_nginx_map(pattern):
    path = example(pattern)
    assert pattern.fullmatch(path), path
    assert name_of(path) == routes.template(pattern), (
        f"{path}: the admin site's map lacks {routes.template(pattern)}"
    )


def test_the_map_names_only_routes_the_api_has():
    templates = {routes.template(p) for p in ROUTES} | {"/openapi.json"}
    exact, regexes, default = route_map()
    names = set(exact.values()) | {value for _, value in regexes}
    assert names - {"<other>", "-"} <= templates, names - templates
    assert default == "<other>"
    assert name_of("/openapi.json") == "/openapi.json"
    assert name_of("/v1/players/42/../../etc") == "<other>"
    assert name_of("/v1/webhooks/42/deliveries/7/retry/x") == "<other>"
