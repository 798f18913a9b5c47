"""authsvc: the platform's player-authentication web service.

Its version has one source, pyproject.toml: ``importlib.metadata.version("authsvc")``.
"""
