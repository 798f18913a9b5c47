"""Test helpers that are not fixtures.

Tests that need a server nobody started (PostgreSQL, nginx, ...) call
``skip_or_fail(reason)``: a skip on a laptop, a failure when
``AUTHSVC_TEST_STRICT=1`` (set by .ci/run), so CI never counts a skip as a pass.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time

import pytest

STRICT = os.environ.get("AUTHSVC_TEST_STRICT") == "1"


def skip_or_fail(reason: str):
    """Skip (laptop) or fail (CI, AUTHSVC_TEST_STRICT=1) a test whose server is missing."""
    if STRICT:
        pytest.fail(f"required in CI (AUTHSVC_TEST_STRICT=1): {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def hold_write_lock(url: str, user_id: int):
    """Another session that holds a write lock on the store (as a long import does); returns release()."""
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE players SET username = username WHERE user_id = ?", (user_id,))
    else:
        import psycopg

        conn = psycopg.connect(url)
        conn.execute("SELECT 1 FROM players WHERE user_id = %s FOR UPDATE", (user_id,))
    # Bounded even if the waiting side never gives up (before the lock wait existed, PostgreSQL waited forever).
    timer = threading.Timer(10, conn.rollback)
    timer.start()

    def release():
        timer.cancel()
        conn.rollback()
        conn.close()

    return release
