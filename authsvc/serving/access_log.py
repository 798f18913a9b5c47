"""gunicorn's logger with a route name for the path: ``logger_class`` in deploy/gunicorn.conf.py.

gunicorn's ``%(U)s`` is PATH_INFO, the decoded path: a client that percent-encodes
the "?" (``/api/authenticate.json%3Fapi_key=...``) puts its query string, api key
and token included, in it. This logger gives ``%(U)s`` the app's route name instead
(``/api/authenticate.json``, ``/healthz`` or ``<other>``, see authsvc.web.app.route_name),
or the route template an app that names its own routes (the admin API) put in the
environ under ``ROUTE_KEY`` (``/v1/players/{user_id}``, never the id; authsvc/loglines.py),
and blanks the atoms that hold the raw request (``%(r)s``, ``%(q)s``, ``%(f)s`` and
the environ atoms), so a format edited later cannot bring them back.

A client that reaches gunicorn directly (docs/scaling.md lets Prometheus reach an app
host) must not write the line's fields with its headers (``X-Forwarded-For: 1.2.3.4 "GET
..." result=200``): no request header is logged as sent. ``%(h)s`` (and the
``X-Forwarded-For`` atom) is the client's address from a trusted proxy (gunicorn's
``forwarded_allow_ips``, or the unix socket, as gunicorn itself decides), when it is
one, else the connection's own address; the ``X-Forwarded-Proto`` atom is the scheme
gunicorn took (it believes that header only from a trusted proxy); the ``X-Request-Id``
atom is the request id in its documented shape, else "-" (authsvc/loglines.py), or the one
an app answered with (the admin API's, ``REQUEST_ID_KEY``); every
other request header atom, the user agent and the user are "-".

A successful probe (``/healthz``, ``/readyz``: a load balancer or a monitoring system
asks every few seconds) is logged at DEBUG, not at INFO; a failing one at INFO. With the
``gunicorn.access`` logger above INFO (``access_record = "edge"``: nginx's line is the
record, docs/logs.md) nothing is logged and no atom is built.
"""

from __future__ import annotations

import functools
import ipaddress
import logging

from gunicorn.glogging import Logger

from authsvc.loglines import REQUEST_ID_KEY, ROUTE_KEY, request_id
from authsvc.web.app import PROBE_PATHS, route_name


@functools.lru_cache(maxsize=8)
def _networks(allowed: tuple[str, ...]) -> tuple | None:
    """forwarded_allow_ips as networks; None for "*" (every peer trusted). gunicorn has checked
    each item; one that is not a network is skipped rather than failing every access line."""
    if "*" in allowed:
        return None
    networks = []
    for item in allowed:
        try:
            networks.append(ipaddress.ip_network(item))
        except ValueError:
            continue
    return tuple(networks)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address, its IPv6 zone dropped (Python takes any text there, spaces
    too)."""
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None


def client_address(environ: dict, allowed: tuple[str, ...]) -> str:
    """The address the access line shows: a trusted proxy's X-Forwarded-For (its last entry,
    when it is an address), else the peer's. A peer that is not an IP address (the unix
    socket) is trusted, as gunicorn trusts it. Only digits, hex letters, ':' and '.' come out."""
    forwarded = environ.get("HTTP_X_FORWARDED_FOR", "").rpartition(",")[2].strip()
    if (
        len(forwarded) > MAX_ADDRESS
    ):  # no address is that long; and the cache below keeps short keys only
        forwarded = ""
    return _client(environ.get("REMOTE_ADDR") or "", forwarded, allowed)


MAX_ADDRESS = 64  # characters: the longest IPv6 text (45) and a zone


@functools.lru_cache(maxsize=4096)
def _client(remote_addr: str, forwarded: str, allowed: tuple[str, ...]) -> str:
    """Cached: an address parse costs microseconds per line, and the callers are a few game
    servers."""
    peer = _ip(remote_addr)
    networks = _networks(allowed)
    if peer is None or networks is None or any(peer in n for n in networks):
        client = _ip(forwarded)
        if client is not None:
            return _shown(client)
    return "-" if peer is None else _shown(peer)


def _shown(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An IPv4 client of a dual-stack socket (::ffff:203.0.113.7) as its IPv4 address."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped if mapped is not None else ip)


class RouteLogger(Logger):
    def access(self, resp, req, environ, request_time):
        log = self.access_log
        if not log.isEnabledFor(logging.DEBUG) and (
            not log.isEnabledFor(
                logging.INFO
            )  # off: gunicorn's access() would build every atom first
            or (environ.get("PATH_INFO") in PROBE_PATHS and str(resp.status).startswith("2"))
        ):
            return
        super().access(resp, req, environ, request_time)

    def atoms(self, resp, req, environ, request_time):
        atoms = {
            k: v
            for k, v in super().atoms(resp, req, environ, request_time).items()
            if not (k.endswith("}e") or k.endswith("}i"))
        }
        route = environ.get(ROUTE_KEY) or route_name(environ.get("PATH_INFO"))
        atoms["U"] = route
        atoms["r"] = f"{atoms.get('m')} {route} {atoms.get('H')}"
        atoms["q"] = atoms["f"] = atoms["a"] = atoms["u"] = "-"
        atoms["h"] = atoms["{x-forwarded-for}i"] = client_address(
            environ, tuple(self.cfg.forwarded_allow_ips)
        )
        atoms["{x-forwarded-proto}i"] = environ.get("wsgi.url_scheme") or "-"
        atoms["{x-request-id}i"] = request_id(
            environ.get(REQUEST_ID_KEY) or environ.get("HTTP_X_REQUEST_ID")
        )
        return atoms
