"""authsvc: the platform's player-authentication web service.

Its version has one source, pyproject.toml: ``release()`` reads it from the installed package's
metadata (CHANGELOG.md says what each release changed).
"""

from importlib import metadata


def release() -> str:
    """This release's version (pyproject.toml), or "unknown" when authsvc runs without being
    installed."""
    try:
        return metadata.version("authsvc")
    except metadata.PackageNotFoundError:
        return "unknown"
