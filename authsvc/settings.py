"""One frozen settings object, read once from the environment and an optional TOML file.

This is the only module that reads ``os.environ``. Precedence: environment
variable, then the TOML file named by ``AUTHSVC_CONFIG``, then the default.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import tomllib
from collections.abc import Mapping

from authsvc.errors import ConfigError

DEFAULT_STATE_DIR = "/var/lib/authsvc"
DEFAULT_SECRET_FILE = "/etc/authsvc/token-secret"
ERROR_STATUS_MODES = ("200", "http")
MIN_SECRET_BYTES = 16
UTF8_BOM = b"\xef\xbb\xbf"

# setting name -> (environment variable, cast)
_FIELDS = {
    "store": ("AUTHSVC_STORE", str),
    "token_secret_file": ("AUTHSVC_TOKEN_SECRET_FILE", str),
    "error_status": ("AUTHSVC_ERROR_STATUS", str),
    "max_body_bytes": ("AUTHSVC_MAX_BODY_BYTES", int),
    "pg_connect_timeout": ("AUTHSVC_PG_CONNECT_TIMEOUT", float),
    "pg_statement_timeout": ("AUTHSVC_PG_STATEMENT_TIMEOUT", float),
    "log_level": ("AUTHSVC_LOG_LEVEL", str),
    "max_staleness": ("AUTHSVC_MAX_STALENESS", float),
}
MAX_STALENESS_BOUND = 1.0  # seconds: a revoked player, disabled game or expired key stops within this


class TokenSecrets(tuple):
    """The token secrets, current first; its repr never shows them."""

    def __repr__(self) -> str:
        return f"<TokenSecrets: {len(self)} secret(s), masked>"

    __str__ = __repr__


@dataclasses.dataclass(frozen=True)
class Settings:
    store: str
    token_secret_file: str
    token_secrets: TokenSecrets = TokenSecrets()
    error_status: str = "200"
    max_body_bytes: int = 16 * 1024
    pg_connect_timeout: float = 2.0
    pg_statement_timeout: float = 2.0
    log_level: str = "INFO"
    max_staleness: float = 1.0

    @property
    def errors_as_http_status(self) -> bool:
        return self.error_status == "http"

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, require_secret: bool = True
    ) -> Settings:
        """Build settings; with ``require_secret`` a missing secret is a ConfigError."""
        env = os.environ if environ is None else environ
        values = _read_toml(env.get("AUTHSVC_CONFIG"))
        for name, (var, _) in _FIELDS.items():
            if env.get(var, "") != "":
                values[name] = env[var]
        unknown = set(values) - set(_FIELDS)
        if unknown:
            raise ConfigError(f"unknown setting(s) in config file: {', '.join(sorted(unknown))}")
        for name, value in list(values.items()):
            cast = _FIELDS[name][1]
            try:
                values[name] = cast(value)
            except (TypeError, ValueError):
                raise ConfigError(f"setting {name} ({_FIELDS[name][0]}) must be {cast.__name__}") from None

        state_dir = env.get("STATE_DIRECTORY", "").split(":")[0] or DEFAULT_STATE_DIR
        values.setdefault("store", "sqlite://" + os.path.join(state_dir, "authsvc.db"))
        cred_dir = env.get("CREDENTIALS_DIRECTORY")
        if "token_secret_file" not in values:
            values["token_secret_file"] = (
                os.path.join(cred_dir, "token-secret") if cred_dir else DEFAULT_SECRET_FILE
            )
        if values.get("error_status", "200") not in ERROR_STATUS_MODES:
            raise ConfigError("AUTHSVC_ERROR_STATUS must be '200' (errors in the body, HTTP 200) or 'http'")
        if values.get("max_body_bytes", 1) <= 0:
            raise ConfigError("AUTHSVC_MAX_BODY_BYTES must be positive")
        if not 0 <= values.get("max_staleness", 0.0) <= MAX_STALENESS_BOUND:
            raise ConfigError(f"AUTHSVC_MAX_STALENESS must be from 0 to {MAX_STALENESS_BOUND:g} seconds")
        for name in ("pg_connect_timeout", "pg_statement_timeout"):
            if values.get(name, 1.0) <= 0:
                raise ConfigError(f"{_FIELDS[name][0]} must be positive")

        path = values["token_secret_file"]
        if require_secret or os.path.exists(path):
            # systemd's LoadCredential= copy is 0400 plus an ACL for the service user,
            # and an ACL's mask shows as the group bits: no group warning there.
            credential = bool(cred_dir) and os.path.dirname(os.path.abspath(path)) == os.path.abspath(cred_dir or "")
            values["token_secrets"] = load_token_secrets(path, systemd_credential=credential)
        return cls(**values)


def _read_toml(path: str | None) -> dict:
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return dict(data.get("authsvc", data))


def load_token_secrets(path: str, *, systemd_credential: bool = False) -> TokenSecrets:
    """Read the secret file: one secret a line, current first; '#' lines are comments.

    Like ssh with a private key, a file other users may read or write is refused:
    whoever reads the secret can mint tokens for every player. A file its group
    may read or write loads with a warning (docs/operations.md installs it 0600).
    """
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read()
    except OSError as e:
        raise ConfigError(
            f"cannot read token secret file {path}: {e.strerror} "
            "(set AUTHSVC_TOKEN_SECRET_FILE, or run 'authsvc init' to create one)"
        ) from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigError(
            f"token secret file {path} is open to other users (mode {stat.S_IMODE(mode):04o}): "
            f"run 'chmod 600 {path}' (owner: the service user)"
        )
    if mode & (stat.S_IRGRP | stat.S_IWGRP) and not systemd_credential:
        logging.getLogger("authsvc").warning(
            "token secret file %s is open to its group (mode %04o): run 'chmod 600 %s' "
            "unless every member of the group may mint tokens",
            path, stat.S_IMODE(mode), path,
        )
    lines = (line.strip() for line in raw.removeprefix(UTF8_BOM).splitlines())
    secrets = [line for line in lines if line and not line.startswith(b"#")]
    if not secrets:
        raise ConfigError(f"token secret file {path} holds no secret")
    if any(len(s) < MIN_SECRET_BYTES for s in secrets):
        raise ConfigError(f"every token secret in {path} must be at least {MIN_SECRET_BYTES} bytes")
    return TokenSecrets(secrets)
