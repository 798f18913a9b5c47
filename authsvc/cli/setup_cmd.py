"""``authsvc setup --api-host HOST --legacy-host HOST [--cert PATH --key PATH]``: nginx's sites for
an installed package (docs/operations.md, section 2).

The package ships nginx's sites with placeholder host names, not enabled. This renders the templates
it ships (APP_DIR/deploy/nginx, with the renderer scripts/install uses) for the given hosts into
nginx's directory, then enables the site with the step scripts/install runs
(APP_DIR/deploy/steps.sh, ``authsvc_enable_site``: one copy of it), which checks nginx's
configuration and reloads nginx. Root's job: the command's wrapper (deploy/bin/authsvc) runs it as
root, not as the service user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from authsvc import deployment
from authsvc.errors import CommandError

NGINX_DIR = "/etc/nginx"


def app_dir() -> str:
    """The installed app's directory: the virtualenv running this is APP_DIR/venv."""
    return os.path.dirname(sys.prefix)


def _render(templates: str, given: dict[str, str]) -> str:
    """The nginx templates rendered for ``given`` into a new temporary directory (the caller removes
    it)."""
    config = os.environ.get("AUTHSVC_CONFIG")
    work = tempfile.mkdtemp(prefix="authsvc-setup-")
    try:
        if config:  # MAX_BODY_BYTES and the upstream's max_conns from the service's own settings
            given = deployment.values_from_settings(config, given)
        deployment.render_tree(templates, work, given)
    except (
        BaseException
    ):  # a RenderError, the settings' ConfigError: said by the command, nothing left behind
        shutil.rmtree(work, ignore_errors=True)
        raise
    return work


def cmd_setup(args, settings):
    base = os.path.join(app_dir(), "deploy")
    templates, steps = os.path.join(base, "nginx"), os.path.join(base, "steps.sh")
    if not (os.path.isdir(templates) and os.path.isfile(steps)):
        raise CommandError(
            f"no nginx templates in {base}: authsvc setup is for an installed package "
            "(from a checkout: scripts/install --api-host ... --legacy-host ...)"
        )
    if (args.cert is None) != (args.key is None):
        raise CommandError(
            "--cert and --key go together: the certificate chain and its private key"
        )
    given = {"API_HOST": args.api_host, "LEGACY_HOST": args.legacy_host}
    if args.cert:
        given.update(TLS_CERT=os.path.abspath(args.cert), TLS_KEY=os.path.abspath(args.key))
    if os.geteuid() != 0:
        raise CommandError(
            "authsvc setup writes nginx's configuration: run it as root (sudo authsvc setup ...)"
        )
    work = _render(templates, given)
    try:
        written = []
        for sub in ("snippets", "sites"):
            dest = os.path.join(NGINX_DIR, "sites-available" if sub == "sites" else sub)
            os.makedirs(dest, exist_ok=True)
            for name in sorted(os.listdir(os.path.join(work, sub))):
                target = os.path.join(dest, name)
                shutil.copyfile(os.path.join(work, sub, name), target + ".new")
                os.chmod(target + ".new", 0o644)
                os.replace(target + ".new", target)
                written.append(target)
    except OSError as e:
        raise CommandError(
            f"cannot write nginx's configuration: {e.strerror}: {e.filename}"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cert = deployment.values_with_defaults(given)["TLS_CERT"]
    retry = "run authsvc setup again"
    done = subprocess.run(
        [
            "sh",
            "-c",
            '. "$0" && authsvc_enable_site "$@"',
            steps,
            NGINX_DIR,
            "authsvc.conf",
            cert,
            retry,
        ],
        capture_output=True,
        text=True,
    )
    report = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise CommandError(
            f"nginx refused the configuration, the site is not reloaded: {' '.join(report.split())}"
        )
    enabled = os.path.islink(
        os.path.join(NGINX_DIR, "sites-enabled", "authsvc.conf")
    ) and os.path.exists(cert)
    obj = {
        "api_host": args.api_host,
        "legacy_host": args.legacy_host,
        "tls_cert": cert,
        "enabled": enabled,
        "written": written,
    }
    text = (
        "\n".join(written)
        + "\n"
        + report
        + "\n"
        + (
            f"nginx serves https://{args.api_host} and http://{args.legacy_host}; next: authsvc "
            "check (docs/operations.md, section 7)"
            if enabled
            else f"site authsvc.conf not enabled: {retry} once {cert} exists"
        )
    )
    return (0 if enabled else 1), obj, text


def add_parsers(top, common, parser_class) -> None:
    text = (
        "render nginx's sites for the API and legacy hosts, enable them and reload nginx (as root)"
    )
    p = top.add_parser("setup", parents=[common], help=text, description=text)
    p.set_defaults(func=cmd_setup)
    p.add_argument("--api-host", required=True, metavar="HOST", help="host name of the HTTPS API")
    p.add_argument(
        "--legacy-host",
        required=True,
        metavar="HOST",
        help="host name of the legacy plain-HTTP API",
    )
    p.add_argument(
        "--cert",
        metavar="PATH",
        help="the API host's certificate chain (default /etc/letsencrypt/live/HOST/fullchain.pem)",
    )
    p.add_argument(
        "--key",
        metavar="PATH",
        help="its private key (default /etc/letsencrypt/live/HOST/privkey.pem)",
    )
