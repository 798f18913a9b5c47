"""``authsvc.wsgi:application``, the path gunicorn configs and units name: authsvc/web/wsgi.py (README.md, "Layout")."""

from authsvc.web.wsgi import __getattr__ as __getattr__
