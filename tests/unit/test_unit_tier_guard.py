"""The unit tier's guard (tests/unit/conftest.py): a socket or a process in a unit test is an error,
and the test that tried fails even when what it ran swallowed the error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.unit.conftest import NotInUnitTier, fail_if_tried, no_sockets_or_processes


@pytest.mark.parametrize(
    "attempt, what",
    [
        (lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM), "socket.__init__"),
        (lambda: socket.create_connection(("127.0.0.1", 9)), "socket.__init__"),
        (lambda: socket.socketpair(), "socket.socketpair"),
        (lambda: subprocess.run([sys.executable, "-c", "pass"]), "Popen._execute_child"),
        (lambda: os.fork(), "os.fork"),
        (lambda: os.system("true"), "os.system"),
        (lambda: os.execv(sys.executable, [sys.executable]), "os.execv"),
    ],
)
def test_a_socket_or_a_process_is_refused_and_recorded(attempt, what):
    attempts: list[str] = []
    with (
        no_sockets_or_processes(attempts),
        pytest.raises(NotInUnitTier, match="move it to tests/functional"),
    ):
        attempt()
    assert attempts == [what]


def test_an_attempt_fails_the_test_even_when_it_was_caught():
    attempts: list[str] = []
    with no_sockets_or_processes(attempts):
        try:
            socket.create_connection(("127.0.0.1", 9))
        except Exception:
            pass  # what code under test does with an error it does not expect
    with pytest.raises(pytest.fail.Exception, match=r"this unit test tried \['socket.__init__'\]"):
        fail_if_tried(attempts)
    fail_if_tried([])  # nothing tried: no failure


def test_the_guard_is_on_in_every_unit_test(_unit_module_guard):
    with pytest.raises(NotInUnitTier):
        socket.socket()
    assert _unit_module_guard == ["socket.__init__"]
    _unit_module_guard.clear()  # tried on purpose: the teardown's check has nothing to fail
