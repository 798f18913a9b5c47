"""One frozen settings object, read once from the environment and an optional TOML file.

This is the only module that reads ``os.environ``. Precedence: environment
variable, then the TOML file named by ``AUTHSVC_CONFIG``, then the default.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping

from authsvc.errors import ConfigError

DEFAULT_STATE_DIR = "/var/lib/authsvc"
DEFAULT_SECRET_FILE = "/etc/authsvc/token-secret"
ERROR_STATUS_MODES = ("200", "http")
MIN_SECRET_BYTES = 16

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
        if "token_secret_file" not in values:
            cred_dir = env.get("CREDENTIALS_DIRECTORY")
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
            values["token_secrets"] = load_token_secrets(path)
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


def load_token_secrets(path: str) -> TokenSecrets:
    """Read the secret file: one secret a line, current first; '#' lines are comments."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(
            f"cannot read token secret file {path}: {e.strerror} "
            "(set AUTHSVC_TOKEN_SECRET_FILE, or run 'authsvc init' to create one)"
        ) from None
    secrets = [
        line.strip() for line in raw.splitlines() if line.strip() and not line.startswith(b"#")
    ]
    if not secrets:
        raise ConfigError(f"token secret file {path} holds no secret")
    if any(len(s) < MIN_SECRET_BYTES for s in secrets):
        raise ConfigError(f"every token secret in {path} must be at least {MIN_SECRET_BYTES} bytes")
    return TokenSecrets(secrets)
