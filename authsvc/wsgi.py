"""``authsvc.wsgi:create_app()`` (and ``:application``), the path gunicorn configs and units name:
authsvc/web/wsgi.py (README.md, "Layout")."""

from authsvc.web.wsgi import __getattr__ as __getattr__
from authsvc.web.wsgi import create_app as create_app
