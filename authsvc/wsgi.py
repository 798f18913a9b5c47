"""``authsvc.wsgi:application`` for gunicorn.

The app is built when gunicorn asks for ``application`` (PEP 562 module
``__getattr__``), not when the module is imported: settings are read and the
store and secret checked then, so a bad configuration stops the worker at boot.
"""

from authsvc.app import make_app
from authsvc.settings import Settings


def __getattr__(name: str):
    if name == "application":
        return make_app(Settings.from_env())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
