"""Section gap: the instructions one worker executes per request, under callgrind, configuration by
configuration.

CPU time per request moves by several percent between runs on a shared machine;
the user-space instructions a worker executes per request do not (three runs of
the bare app: 919,265 / 920,580 / 920,825). Each row is one gunicorn worker under
``valgrind --tool=callgrind``, sent ``--gap-warm`` then ``--gap-requests``
sequential requests; callgrind dumps its counts when the first and the last of
those requests end (a post_request hook calls a marker function), so a row counts
exactly those requests: the worker's Python, gunicorn, SQLite, OpenSSL, libc;
not the kernel. Rows differ in one thing, so their differences say what each
thing costs (BENCHMARKS.md, "The shipped path against plain"). The shipped rows run as
the unit does: deploy/gunicorn.conf.py with the shipped settings file
(deploy/etc/authsvc.toml: access_record = "edge", nginx's line the one record);
the access_record = "app" rows say what gunicorn's access line and the auth line cost.
``--gap-against CHECKOUT`` runs the same rows in another checkout (an earlier commit's
worktree) in the same run, by its own gap section, and prints both with their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench.sections.nginx import nginx_in_front
from benchmarks.bench.sections.postgres import postgres_copy
from benchmarks.bench.serve import LEGACY_HOST, port_open, unix_socket_open
from benchmarks.bench.world import APPS, REPO, SHIPPED_ENV, VENV_BIN, World
from harness.processes import free_port, stop

# access_record = "app" (the default; gunicorn exposed without nginx): gunicorn's access line and
# the auth line.
APP_RECORD = {"AUTHSVC_ACCESS_RECORD": "app"}
NO_AUTH_LINE = {"AUTHSVC_LOG_LEVEL": "WARNING"}
PLAIN_FLAGS = ("--workers", "1", "--worker-class", "sync", "--preload", "--log-level", "warning")
# What a game server's HTTP client sends besides Host (curl, requests, a Java client send a few
# such).
CLIENT_HEADERS = {
    "User-Agent": "game-server/1.0",
    "Accept": "application/json",
    "Accept-Encoding": "gzip, deflate",
}
# The shipped proxy snippet as it was: every client header passed on, nginx's own set on top.
FORWARD_ALL = ("proxy_pass_request_headers off;", "proxy_pass_request_headers on;")
# The site rendered for access_record = "app": nginx also sends X-Forwarded-For, X-Forwarded-Proto,
# X-Request-Id.
RENDER_APP = {"ACCESS_RECORD": "app"}


@dataclasses.dataclass(frozen=True)
class Config:
    """One row: ``conf`` "shipped" is deploy/gunicorn.conf.py (plus ``extra`` lines), "plain"
    gunicorn's flags PLAIN_FLAGS and nothing else; ``nginx`` False: the client talks to gunicorn
    over TCP; ``bind`` "unix" or "tcp" (behind nginx); ``snippet``: (old, new) replacements in the
    rendered proxy snippet; ``engine`` "sqlite" or "postgresql" (the store of --pg);
    ``client_headers`` False: the client sends no header but Host (and http.client's
    Accept-Encoding: identity); ``render``: placeholder values of the nginx site (the shipped
    authsvc.toml's access_record unless told)."""

    label: str
    conf: str = "shipped"
    app: str = APPS["authsvc"]
    env: dict = dataclasses.field(default_factory=dict)
    extra: str = ""
    nginx: bool = True
    bind: str = "unix"
    snippet: tuple = ()
    engine: str = "sqlite"
    client_headers: bool = True  # False: the client sends Host only
    render: dict = dataclasses.field(default_factory=dict)


PLAIN = "plain: gunicorn -w1 -k sync --preload, no nginx"
SHIPPED = "shipped: nginx, deploy/gunicorn.conf.py, deploy/etc/authsvc.toml (access_record = edge)"
APP = "shipped with access_record = app: gunicorn's access line and the auth line"
PG = ", PostgreSQL"
CONFIGS = [
    Config(PLAIN, conf="plain", nginx=False),
    Config(SHIPPED),
    # What access_record = "app" costs behind nginx: the two lines, then gunicorn's alone.
    Config(APP, env=APP_RECORD, render=RENDER_APP),
    Config(
        "shipped with access_record = app, no auth line (gunicorn's access line alone)",
        env={**APP_RECORD, **NO_AUTH_LINE},
        render=RENDER_APP,
    ),
    # One thing changed against the shipped row each.
    Config("shipped, every client header forwarded (as before)", snippet=(FORWARD_ALL,)),
    Config(
        "shipped, with X-Forwarded-For, X-Forwarded-Proto, X-Request-Id (the site rendered for "
        "app)",
        render=RENDER_APP,
    ),
    Config("shipped, TCP instead of the unix socket", bind="tcp"),
    Config("shipped, gunicorn's own sync worker", extra="worker_class = 'sync'\n"),
    Config("shipped, no --preload", extra="preload_app = False\n"),
    Config("shipped, metrics off", app="benchmarks.variants:authsvc_without_metrics"),
    Config(
        "shipped, no redact filter",
        extra="logconfig_dict['loggers']['gunicorn.error'].pop('filters')\n",
    ),
    Config("shipped, no logconfig_dict", extra="logconfig_dict = {}\n"),
    Config(
        "shipped, gthread (2 threads, nginx keeps the connection)", env={"AUTHSVC_THREADS": "2"}
    ),
    # A client that sends no header of its own: plain parses fewer, the shipped path the same.
    Config(PLAIN + ", a client sending Host only", conf="plain", nginx=False, client_headers=False),
    Config(SHIPPED + ", a client sending Host only", client_headers=False),
    # From the other end: plain's flags behind nginx.
    Config("plain's flags behind nginx (unix socket)", conf="plain"),
    # The bare app: what gunicorn and nginx cost alone.
    Config("bare app, plain", conf="plain", nginx=False, app=APPS["bare"]),
    Config("bare app, shipped", app=APPS["bare"]),
    # The other engine.
    Config(PLAIN + PG, conf="plain", nginx=False, engine="postgresql"),
    Config(SHIPPED + PG, engine="postgresql"),
    Config(APP + PG, engine="postgresql", env=APP_RECORD, render=RENDER_APP),
]
MARKER = """
import binascii as _binascii
_served = [0]


def post_request(worker, req, environ, resp):
    # scripts/bench's gap section: callgrind dumps its counts at each call of crc_hqx.
    _served[0] += 1
    if _served[0] in ({first}, {last}):
        _binascii.crc_hqx(b"", 0)
"""


def selected(configs: list[Config], wanted: str) -> list[Config]:
    """The rows ``--gap-rows`` names: comma-separated row numbers (from 1, in CONFIGS' order) or
    texts found in labels (none: every row)."""
    texts = [t.strip() for t in wanted.split(",") if t.strip()]
    if not texts:
        return configs
    return [
        c
        for i, c in enumerate(configs, 1)
        if any(t == str(i) or (not t.isdigit() and t in c.label) for t in texts)
    ]


def drive(port: int, paths: list[str], count: int, host: str | None, client_headers: bool) -> None:
    """``count`` requests, one at a time, on one keep-alive connection (to nginx) or one each (to
    gunicorn), with a game server's few headers (``client_headers``) or none."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {**(CLIENT_HEADERS if client_headers else {}), **({"Host": host} if host else {})}
    try:
        for i in range(count):
            conn.request("GET", paths[i % len(paths)], headers=headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200 or not body.startswith(b'{"success":true,'):
                raise SystemExit(f"bench: gap: answered {response.status} {body[:200]!r}")
    finally:
        conn.close()


def edit_snippet(site_root: Path, replacements: tuple) -> None:
    """Replace text in the rendered proxy snippet; a text that is not there stops the run (a row
    that no longer changes anything)."""
    snippet = site_root / "deploy" / "nginx" / "snippets" / "authsvc-proxy.conf"
    text = snippet.read_text()
    for old, new in replacements:
        if old not in text:
            raise SystemExit(f"bench: gap: {old!r} is not in the shipped proxy snippet")
        text = text.replace(old, new)
    snippet.write_text(text)


def instructions(
    world: World, args: argparse.Namespace, root: Path, config: Config, store: str
) -> float:
    """The instructions per request of the row's one worker, between the two markers."""
    # Unique per row (labels that share their first characters: the shipped row and its variants).
    slug = (
        re.sub(r"[^a-z0-9]+", "-", config.label.lower()).strip("-")[:48]
        + "-"
        + hashlib.sha1(config.label.encode()).hexdigest()[:8]
    )
    conf = root / f"{slug}.conf.py"
    sock = root / "authsvc.sock"
    port = free_port()
    bind = f"unix:{sock}" if config.nginx and config.bind == "unix" else f"127.0.0.1:{port}"
    marker = MARKER.format(first=args.gap_warm, last=args.gap_warm + args.gap_requests)
    command = [
        str(VENV_BIN / "python"),
        "-m",
        "gunicorn",
        "--no-control-socket",
        "--config",
        str(conf),
    ]
    # The queue's wait is checked as shipped, against a bound no request under callgrind passes.
    environ = {
        **os.environ,
        **world.env,
        "PYTHONPATH": str(REPO),
        "PYTHONHASHSEED": "0",
        "AUTHSVC_MAX_QUEUE_WAIT": "60",
        "AUTHSVC_STORE": store,
        **config.env,
    }
    if config.conf == "shipped":
        shipped = REPO / "deploy" / "gunicorn.conf.py"
        conf.write_text(
            f"__file__ = {str(shipped)!r}\nexec(compile(open(__file__).read(), __file__, 'exec'))\n"
            f"timeout = 600\n{config.extra}{marker}"
        )
        # As the unit starts it: the shipped settings file (access_record = "edge"); the row's env
        # beats it.
        environ.update(
            SHIPPED_ENV, AUTHSVC_BIND=bind, AUTHSVC_WORKERS="1", STATE_DIRECTORY=str(root)
        )
    else:
        conf.write_text(f"timeout = 600\n{config.extra}{marker}")
        command += [*PLAIN_FLAGS, "--bind", bind]
    ready = (
        (lambda: unix_socket_open(sock)) if bind.startswith("unix:") else (lambda: port_open(port))
    )
    out = root / f"{slug}.%p.callgrind"
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--dump-before=binascii_crc_hqx*",
        *command,
        config.app,
    ]
    with contextlib.ExitStack() as stack:
        if config.nginx:
            upstream = {**config.render, **({} if config.bind == "unix" else {"UPSTREAMS": bind})}
            _, http_port, _ = stack.enter_context(
                nginx_in_front(
                    world,
                    root / f"nginx-{slug}",
                    sock,
                    overrides=upstream,
                    edit=lambda site: edit_snippet(site, config.snippet),
                )
            )
            client_port, host = http_port, LEGACY_HOST
        else:
            client_port, host = port, None
        with (root / f"{slug}.log").open("wb") as log:
            proc = subprocess.Popen(
                command,
                env=environ,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 600
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"bench: gap: gunicorn ({config.label}) did not start; see "
                        f"{root / (slug + '.log')}"
                    )
                time.sleep(0.2)
            drive(
                client_port,
                world.paths(),
                args.gap_warm + args.gap_requests,
                host,
                config.client_headers,
            )
            worker = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
        finally:
            stop(proc, timeout=120)
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
    dump = Path(str(out).replace("%p", worker) + ".2")  # from the first marker to the second
    found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
    if not found:
        raise SystemExit(f"bench: gap: no counts in {dump}")
    return int(found.group(1)) / args.gap_requests


def against(args: argparse.Namespace, checkout: Path, numbers: list[int]) -> dict[str, float]:
    """The rows ``numbers`` (this checkout's) measured by another checkout's own gap section, with
    its own store, deploy/ files and code, run by this virtualenv's Python: {label: instructions per
    request}. Rows are matched by label; one the other checkout lacks is absent."""
    command = [
        str(VENV_BIN / "python"),
        "-m",
        "benchmarks.bench",
        "--only",
        "gap",
        "--players",
        str(args.players),
        "--gap-warm",
        str(args.gap_warm),
        "--gap-requests",
        str(args.gap_requests),
        "--gap-rows",
        ",".join(map(str, numbers)),
        "--pg",
        args.pg,
    ]
    environ = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(command, cwd=checkout, env=environ, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench: gap: the run in {checkout} failed:\n{done.stderr[-2000:]}")
    return {
        m.group(1).strip(): float(m.group(2).replace(",", ""))
        for m in re.finditer(r"^  gap: (.+?)\s+([0-9,]+) instructions/request$", done.stderr, re.M)
    }


def other_checkout(args: argparse.Namespace) -> Path | None:
    """--gap-against's checkout, refused before anything is measured unless it has a gap section."""
    if not args.gap_against:
        return None
    checkout = Path(args.gap_against).resolve()
    if not (checkout / "benchmarks" / "bench" / "sections" / "gap.py").is_file():
        raise SystemExit(f"bench: gap: {checkout} is not a checkout of authsvc with a gap section")
    return checkout


def runs(counts: list[float] | None) -> str:
    """A row's counts for the table: the median, then every round's in brackets when there are
    several."""
    if not counts:
        return "-"
    median = f"{statistics.median(counts):,.0f}"
    return median if len(counts) == 1 else f"{median} ({' / '.join(f'{c:,.0f}' for c in counts)})"


def checkout_name(checkout: Path) -> str:
    """The other checkout's commit, short, for the table's header."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or str(checkout)


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    if not shutil.which("valgrind"):
        raise SystemExit("bench: the gap section needs valgrind (Debian: apt-get install valgrind)")
    checkout = other_checkout(args)
    root = world.root / "gap"
    root.mkdir(exist_ok=True)
    configs = selected(CONFIGS, args.gap_rows)
    # Each row's counts, one per round; with --gap-against the other checkout's too, its round right
    # after ours, so both see the same hour of the machine. Medians are what the tables show.
    rounds = max(1, args.gap_rounds)
    ours: dict[str, list[float]] = {c.label: [] for c in configs}
    theirs: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        stores = {"sqlite": world.env["AUTHSVC_STORE"]}
        if any(c.engine == "postgresql" for c in configs):
            stores["postgresql"] = stack.enter_context(postgres_copy(world, args.pg))
        for _ in range(rounds):
            for config in configs:
                count = instructions(world, args, root, config, stores[config.engine])
                ours[config.label].append(count)
                print(
                    f"  gap: {config.label:<60} {count:12,.0f} instructions/request",
                    file=sys.stderr,
                    flush=True,
                )
            if checkout is not None:
                other = against(args, checkout, [CONFIGS.index(c) + 1 for c in configs])
                for label, count in other.items():
                    theirs.setdefault(label, []).append(count)
    rows = {label: statistics.median(counts) for label, counts in ours.items()}
    print(
        f"\n2b. The shipped topology's gap: instructions per request of one worker under callgrind "
        f"({args.gap_requests} sequential requests after {args.gap_warm}; user space only; "
        f"{world.players:,} players)\n"
    )
    print(
        "| configuration | instructions per request | vs plain of its engine | vs shipped of its "
        "engine |"
    )
    print("|---|---|---|---|")
    for config in configs:
        suffix = PG if config.engine == "postgresql" else ""
        plain, shipped = rows.get(PLAIN + suffix), rows.get(SHIPPED + suffix)
        if config.app == APPS["bare"]:
            plain, shipped = rows.get("bare app, plain"), rows.get("bare app, shipped")
        count = rows[config.label]
        vs_plain, vs_shipped = (f"{count / ref:.3f}" if ref else "-" for ref in (plain, shipped))
        print(f"| {config.label} | {count:,.0f} | {vs_plain} | {vs_shipped} |")
    if checkout is not None:
        name = checkout_name(checkout)
        how = (
            f"the median of {rounds} rounds each, taken in turn, same run"
            if rounds > 1
            else "same run"
        )
        print(f"\nThe same rows in {name} ({checkout}), {how}:\n")
        print(f"| configuration | {name} | this checkout | this / {name} |")
        print("|---|---|---|---|")
        for config in configs:
            counts = theirs.get(config.label)
            median = statistics.median(counts) if counts else None
            ratio = f"{rows[config.label] / median:.3f}" if median else "-"
            print(f"| {config.label} | {runs(counts)} | {runs(ours[config.label])} | {ratio} |")
    print()
    for engine, suffix in (("SQLite", ""), ("PostgreSQL", PG)):
        if PLAIN + suffix in rows and SHIPPED + suffix in rows:
            print(
                f"{engine}: shipped / plain = {rows[SHIPPED + suffix] / rows[PLAIN + suffix]:.3f}"
                + (
                    f"; with access_record = app {rows[APP + suffix] / rows[PLAIN + suffix]:.3f}"
                    if APP + suffix in rows
                    else ""
                )
            )
