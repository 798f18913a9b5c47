"""The benchmark behind scripts/bench and BENCHMARKS.md: authsvc against a bare WSGI app and Flask.

Every figure that matters is a ratio against a reference measured in the same
run, rounds alternating between the apps, because the machines are shared and
noisy. The sections (``--only``, default all) are the table in
benchmarks/bench/sections/__init__.py; ``scripts/bench --help`` lists them.

Each server is checked before it is measured (a valid request, a 403 and a 400
must answer as documented) and after (valid requests still succeed), so a broken
server cannot look fast. Only loopback is used; every wrk run is bounded by
``--duration``. Run it with ``scripts/bench`` (it makes the venv and finds wrk),
or ``python -m benchmarks.bench`` from the repository's root.

Layout: world.py (the store and in-process timing), serve.py (servers, checks,
wrk, tables), sections/ (one module per section), __main__.py (options, the run).
Process helpers (free ports, starting gunicorn and nginx) are harness/'s, shared
with the tests.
"""

from benchmarks.bench.serve import Server, check_answers
from benchmarks.bench.world import World, make_world

__all__ = ["Server", "World", "check_answers", "make_world"]
