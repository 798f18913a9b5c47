"""The app gunicorn loads, in a process of its own, holds no store that can write and no admin
module (README.md, "Layout"; the import arrows themselves: tests/unit/test_layout.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import ADMIN_WINGS, WRITER_MODULES


def test_the_web_process_holds_no_store_that_can_write(env, world):
    """The app gunicorn loads, in a process of its own: its store is a Reader with no write method,
    and neither writer module nor the admin side was imported."""
    code = (
        "import sys\nfrom authsvc.wsgi import application\nfrom authsvc.store.base import Reader, "
        "Store\nstore = application.store\nassert isinstance(store, Reader) and not "
        "isinstance(store, Store), type(store)\nassert not [m for m in dir(Store) if m not in "
        "dir(Reader) and hasattr(store, m)], type(store)\nassert store.credentials('', 1) is None\n"
        f"admin = {tuple(f'authsvc.{w}' for w in sorted(ADMIN_WINGS))!r}\n"
        f"loaded = [m for m in sys.modules if m in {sorted(WRITER_MODULES)!r} or "
        "m.startswith(admin)]\nassert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True, timeout=120)
