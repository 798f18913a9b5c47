"""The gunicorn integration: workers answering in JSON, the access logger, redaction (README.md,
"Layout")."""
