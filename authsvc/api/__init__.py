"""The admin HTTP API (docs/admin-api.md): its app, routes, errors and limits, over the operations
layer (authsvc/operations/), served by gunicorn as a service of its own (README.md, "Layout")."""
