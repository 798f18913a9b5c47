"""The unit tier opens no socket and starts no process (tests/tiers.py): here, trying to is an
error.

For every unit test module, socket creation, bind and connect, and every way to start a process
(subprocess, os.fork, the exec and spawn families, os.system, multiprocessing's fork_exec) raise
``NotInUnitTier``, an Exception but no OSError, so code that handles a refused connection does not
take it for one. Each attempt is also recorded, and the test that made it fails at its teardown even
when the code under test swallowed the error. PostgreSQL (libpq's sockets are C, out of reach) is
refused at its fixture. A test that needs any of these belongs in tests/functional (in-process WSGI
through WebTest, nothing else) or tests/integration (processes, servers).
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import socket
import subprocess

import pytest

# What a unit test may not call: (module or class, attribute).
FORBIDDEN = [
    (socket.socket, "__init__"),
    (socket.socket, "bind"),
    (socket.socket, "connect"),
    (socket.socket, "connect_ex"),
    (socket, "socketpair"),
    (socket, "fromfd"),
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
    (os, "system"),
    *(
        (os, name)
        for name in (
            "fork",
            "forkpty",
            "posix_spawn",
            "posix_spawnp",
            "execv",
            "execve",
            "execvp",
            "execvpe",
            "execl",
            "execle",
            "execlp",
            "execlpe",
            "spawnv",
            "spawnve",
            "spawnvp",
            "spawnvpe",
            "spawnl",
            "spawnle",
            "spawnlp",
            "spawnlpe",
        )
        if hasattr(os, name)
    ),
]


class NotInUnitTier(Exception):
    """A unit test opened a socket or started a process."""


def _refuse(what: str, attempts: list[str]):
    def refused(*args, **kwargs):
        attempts.append(what)
        raise NotInUnitTier(
            f"{what}: a unit test opens no socket and starts no process (tests/tiers.py); "
            "move it to tests/functional (in-process WSGI) or tests/integration (processes)"
        )

    return refused


@contextlib.contextmanager
def no_sockets_or_processes(attempts: list[str]):
    """Within it, every call of FORBIDDEN raises NotInUnitTier and is recorded in ``attempts``."""
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in FORBIDDEN:
            qualified = f"{getattr(owner, '__name__', owner)}.{name}"
            patch.setattr(owner, name, _refuse(qualified, attempts))
        yield


def fail_if_tried(attempts: list[str]) -> None:
    """Fail the test that made ``attempts``, whether or not what it ran caught the error."""
    if attempts:
        pytest.fail(
            f"this unit test tried {sorted(set(attempts))}: {NotInUnitTier.__doc__}", pytrace=False
        )


@pytest.fixture(scope="module", autouse=True)
def _unit_module_guard():
    """Guards the whole module, its module-scoped fixtures included; yields the attempts' record."""
    attempts: list[str] = []
    with no_sockets_or_processes(attempts):
        yield attempts


@pytest.fixture(autouse=True)
def _unit_test_guard(_unit_module_guard):
    attempts = _unit_module_guard
    attempts.clear()
    yield
    fail_if_tried(attempts)


@pytest.fixture(scope="session")
def pg_server_url():
    """No PostgreSQL in the unit tier: libpq's sockets are out of the guard's reach, so it is
    refused here."""
    raise NotInUnitTier(
        "a unit test uses no PostgreSQL server (tests/tiers.py): move it to tests/store or "
        "tests/integration"
    )
