"""gunicorn's logger with a route name for the path: ``logger_class`` in deploy/gunicorn.conf.py.

gunicorn's ``%(U)s`` is PATH_INFO, the decoded path: a client that percent-encodes
the "?" (``/api/authenticate.json%3Fapi_key=...``) puts its query string, api key
and token included, in it. This logger gives ``%(U)s`` the app's route name instead
(``/api/authenticate.json``, ``/healthz`` or ``<other>``, see authsvc.app.route_name),
and blanks the atoms that hold the raw request (``%(r)s``, ``%(q)s``, ``%(f)s`` and
the environ atoms), so a format edited later cannot bring them back.

A successful probe (``/healthz``, ``/readyz``: a load balancer or a monitoring system
asks every few seconds) is logged at DEBUG, not at INFO; a failing one at INFO.
"""

from __future__ import annotations

import logging

from gunicorn.glogging import Logger

from authsvc.app import PROBE_PATHS, route_name


class RouteLogger(Logger):
    def access(self, resp, req, environ, request_time):
        if environ.get("PATH_INFO") in PROBE_PATHS and str(resp.status).startswith("2") and not self.access_log.isEnabledFor(
            logging.DEBUG
        ):
            return
        super().access(resp, req, environ, request_time)

    def atoms(self, resp, req, environ, request_time):
        atoms = {k: v for k, v in super().atoms(resp, req, environ, request_time).items() if not k.endswith("}e")}
        route = route_name(environ.get("PATH_INFO"))
        atoms["U"] = route
        atoms["r"] = f"{atoms.get('m')} {route} {atoms.get('H')}"
        atoms["q"] = "-"
        atoms["f"] = "-"
        return atoms
