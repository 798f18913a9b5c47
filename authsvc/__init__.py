"""authsvc: the platform's player-authentication web service."""

__version__ = "0.1.0"
