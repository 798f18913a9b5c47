"""gunicorn settings for authsvc: ``gunicorn -c gunicorn.conf.py 'authsvc.wsgi:create_app()'``
(the admin API: ``'authsvc.api.wsgi:create_app()'``, gunicorn's app factories).

Installed as /opt/authsvc/gunicorn.conf.py (code, replaced on upgrade). Tuning comes
from the ``[gunicorn]`` table of the settings file named by ``AUTHSVC_CONFIG``
(/etc/authsvc/authsvc.toml), and an environment variable beats the file. The file
is read, and every setting in it checked, by authsvc/settings.py, the reader the
app uses (declarations there, docs/configuration.md):

    workers       AUTHSVC_WORKERS        at least 1, default: the number of CPUs (BENCHMARKS.md)
    worker_class  AUTHSVC_WORKER_CLASS   "sync" (default) or "gthread": gunicorn's, answering
                                         in JSON (authsvc/serving/workers.py)
    threads       AUTHSVC_THREADS        default 1 (gthread only)
    timeout       AUTHSVC_TIMEOUT        seconds, at least 1, default 30
    bind          AUTHSVC_BIND           default unix:/run/authsvc.sock; unused
                                         under systemd socket activation
    forwarded_allow_ips AUTHSVC_FORWARDED_ALLOW_IPS  default 127.0.0.1,::1: the proxies
                                         whose X-Forwarded-* headers are believed
    log_level     AUTHSVC_LOG_LEVEL      (an app setting: the file's top level) level of
                                         the app's "authsvc" logger, default INFO
    access_record AUTHSVC_ACCESS_RECORD  (an app setting) "app" (default): the access log
                                         below is on; "edge" (behind nginx, the shipped
                                         file): off, nginx's line is the record (docs/logs.md)

A wrong or unknown setting stops gunicorn here with one line on stderr (the
journal) and exit status 1, before anything listens.

Logs go to stderr (error log, including the app's "authsvc" logger) and stdout
(access log): the journal under systemd. No file is written outside the state
directory: no pid file, no control socket, worker heartbeat files in
$STATE_DIRECTORY (created and unlinked at once).
"""

import os

from authsvc.errors import ConfigError
from authsvc.settings import GunicornSettings, metrics_dir

try:
    _settings = GunicornSettings.from_env()
except ConfigError as e:
    raise SystemExit(f"authsvc: error: {e}") from None

wsgi_app = "authsvc.wsgi:create_app()"
bind = [_settings.bind]
# The SQLite store keeps a worker on the CPU for the whole request, so one worker
# per CPU gives the same throughput as 2 x CPUs + 1 with a lower p99 (BENCHMARKS.md,
# section 2). With a PostgreSQL store across a network, workers wait on the round
# trip: raise it (e.g. 2 x CPUs + 1).
workers = _settings.workers
threads = _settings.threads
# gunicorn's own sync and gthread workers, whose error answers (a request gunicorn
# cannot parse) are the service's JSON instead of HTML (authsvc/serving/workers.py):
# the game-facing JSON, or the admin API's problem+json when it is the app served.
# Slow and idle clients are nginx's to absorb (both sites read a whole request before
# passing it on): gunicorn serves only nginx, on a unix socket (docs/admin-api.md, "Slow clients").
# "sync" with threads > 1 is gthread, as gunicorn itself decides.
_worker_kind = "gthread" if threads > 1 else _settings.worker_class
worker_class = {
    "sync": "authsvc.serving.workers.SyncWorker",
    "gthread": "authsvc.serving.workers.ThreadWorker",
}[_worker_kind]
# Above every wait of a request on the store (AUTHSVC_PG_REPLY_TIMEOUT, 3 s; a connect, 2 s per
# address): a worker waiting on PostgreSQL answers 503 itself and is never killed (docs/stores.md,
# "Outages").
timeout = _settings.timeout
graceful_timeout = 30
keepalive = 5

# Preloaded: the app is built, and the store and secret checked, once in the master
# at start-up. A worker respawned later (a crash, max_requests, HUP) forks from it
# and never re-runs the check, so a PostgreSQL outage cannot make a new worker
# fail to boot and take the whole server down (docs/stores.md). Each worker still
# opens its own store connection after fork. Code and settings changes therefore
# need `systemctl restart authsvc`; the socket unit keeps the socket open meanwhile.
preload_app = True

# nginx is the only client: over the unix socket (which only nginx's group may
# open) gunicorn trusts X-Forwarded-Proto; over TCP only from this machine, or the
# addresses of forwarded_allow_ips ([gunicorn] table: an nginx on another host,
# docs/scaling.md). The access log's address is X-Forwarded-For only from those
# peers, the connection's own otherwise (authsvc/serving/access_log.py).
forwarded_allow_ips = _settings.forwarded_allow_ips
secure_scheme_headers = {"X-FORWARDED-PROTO": "https"}
# Never take SCRIPT_NAME / PATH_INFO from a request header.
forwarder_headers = ""

# Looser than nginx (deploy/nginx/snippets/authsvc-limits.conf), so nginx refuses
# first and in JSON whatever is too large, and gunicorn never refuses what nginx
# passed. nginx holds a request line or a header line in one 8 KiB buffer (CRLF
# included: at most 8,190 bytes, the most gunicorn allows for the request line; nginx
# passes the client's URI unchanged), and all of them in 4 x 8 KiB: at most ~11,000
# header lines of 3 bytes. nginx rewrites a header as "Name: value" (one byte more than
# "Name:value") and adds its own few (authsvc-proxy.conf).
limit_request_line = 8190
limit_request_fields = 16384
limit_request_field_size = 16384

# Nothing outside the state directory.
pidfile = None
control_socket_disable = True
worker_tmp_dir = os.environ.get("STATE_DIRECTORY", "").split(":")[0] or None
umask = 0o077

# Access log: method and route name only. %(U)s is the app's route name
# (/api/authenticate.json, /healthz or <other>), never the decoded path, which
# holds the query string when a client percent-encodes the "?"; never %(r)s,
# %(q)s, %(f)s. No header is logged as a client sent it (authsvc/serving/access_log.py):
# %(h)s is the client's address from a trusted proxy's X-Forwarded-For, else the
# connection's own; proto= the scheme gunicorn took; rid= the request id in its
# documented shape, else "-". result= is the app's result code (X-Authsvc-Result:
# 403 for wrong credentials, though HTTP 200 on the wire; docs/logs.md).
# Behind nginx (access_record = "edge") nginx's access line is a request's one record, and
# this log is off: the gunicorn.access logger above INFO, so RouteLogger returns at once
# (it costs a worker 390,000 instructions a request: BENCHMARKS.md, "The shipped path against
# plain", rows 4 - 6).
logger_class = "authsvc.serving.access_log.RouteLogger"
access_log_format = (
    '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(B)s %(M)sms '
    "proto=%({x-forwarded-proto}i)s rid=%({x-request-id}i)s result=%({x-authsvc-result}o)s"
)
_access_log_on = _settings.access_record == "app"
accesslog = "-" if _access_log_on else None
errorlog = "-"
loglevel = "info"
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "authsvc.serving.redact.RedactFilter"}},
    "formatters": {
        # The time text made once a second, not per line (authsvc/loglines.py).
        "error": {
            "class": "authsvc.loglines.CachedTimeFormatter",
            "format": "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s",
            "datefmt": "%Y-%m-%d %H:%M:%S %z",
        },
        "access": {"format": "%(message)s"},
    },
    "handlers": {
        "error": {
            "class": "logging.StreamHandler",
            "formatter": "error",
            "stream": "ext://sys.stderr",
        },
        "access": {
            "class": "logging.StreamHandler",
            "formatter": "access",
            "stream": "ext://sys.stdout",
        },
    },
    "root": {"level": "WARNING", "handlers": ["error"]},
    "loggers": {
        "gunicorn.error": {
            "level": "INFO",
            "handlers": ["error"],
            "propagate": False,
            "filters": ["redact"],
        },
        "gunicorn.access": {
            "level": "INFO" if _access_log_on else "WARNING",
            "handlers": ["access"],
            "propagate": False,
        },
        # The app logs the frames of unexpected errors, never the query string;
        # gunicorn's own request errors go through authsvc/serving/redact.py.
        "authsvc": {
            "level": _settings.log_level,
            "handlers": ["error"],
            "propagate": False,
        },
        # The admin API's head lines: the audit chain's head after each committed write
        # (docs/logs.md, "The audit head line"), what `authsvc audit verify --anchor` checks the
        # chain against. At INFO whatever log_level says: a line not written leaves its records
        # unanchored.
        "authsvc.audit": {"level": "INFO", "handlers": ["error"], "propagate": False},
    },
}

# Metrics (docs/operations.md, "Monitoring"; authsvc/web/metrics.py), with the metrics extra:
# every worker counts into files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's
# multiprocess mode), so a scrape answered by any worker shows the sum of all.
# authsvc/settings.py (metrics_dir) picks it: the systemd unit sets it inside its
# RuntimeDirectory (/run/authsvc/metrics); without it, "metrics" in $RUNTIME_DIRECTORY
# or $STATE_DIRECTORY, else a directory of its own under the temporary directory,
# removed at exit (a run by hand).
# It must be set before the preloaded app imports prometheus_client, so here, at
# load (a HUP reload keeps the value already set). on_starting empties it once per
# start: counters restart from 0 with the master, as Prometheus expects of a restart.
_metrics_dir = metrics_dir()
if _metrics_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir
else:
    import tempfile

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="authsvc-metrics-")
    os.environ["AUTHSVC_METRICS_DIR_OWNED"] = "1"
os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], mode=0o700, exist_ok=True)


def _metrics_files():
    path = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    return [os.path.join(path, name) for name in os.listdir(path) if name.endswith(".db")]


def on_starting(server):
    """Counts of an earlier run (a crash leaves its files) must not add to this one's."""
    for name in _metrics_files():
        os.unlink(name)


def child_exit(server, worker):
    """A dead worker's counters stay (its files are kept); its live gauges go (none today)."""
    try:
        from prometheus_client import multiprocess
    except ImportError:
        return
    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if os.environ.get("AUTHSVC_METRICS_DIR_OWNED"):
        import shutil

        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
