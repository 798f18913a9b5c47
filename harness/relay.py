"""A userspace TCP relay on loopback that can blackhole, for the network-fault tests.

``Relay(target_port)`` listens on 127.0.0.1:<free port> and forwards every connection
to 127.0.0.1:target_port. ``blackhole()`` makes it behave like a network that went
silent: the kernel still acknowledges what is sent (as a pooler in between does, or
a lossy path where nothing stays unacknowledged), so neither ``tcp_user_timeout``
nor keepalives notice; nothing is forwarded either way, and a new connection is
accepted but never reaches the server. ``restore()`` lets the held bytes through.
``stall(chance, longest)`` is what loss looks like to the app on a lossy path: each
reply chunk is held, with that chance, for a random time up to ``longest`` seconds
(TCP retransmitting it with its growing backoff), then forwarded; nothing is lost
and the kernel acknowledges all along.
It runs in threads of the test process; ``close()`` ends them.
"""

from __future__ import annotations

import random
import select
import socket
import threading

from harness.processes import free_port


class Relay:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.port = free_port()
        self.accepted = 0  # connections accepted so far (a connection attempt of a client)
        self.blackholed = threading.Event()
        self.stalls = (0.0, 0.0)  # (chance, longest seconds) a reply chunk is held
        self._random = random.Random()
        self.stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def blackhole(self) -> None:
        self.blackholed.set()

    def restore(self) -> None:
        self.blackholed.clear()
        self.stalls = (0.0, 0.0)

    def stall(self, chance: float, longest: float) -> None:
        self.stalls = (chance, longest)

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self.stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._keep(client)
            if self.blackholed.is_set():
                continue  # held open, never forwarded: a SYN that got an answer, then silence
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            thread = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        while not self.stopped.is_set():
            if self.blackholed.is_set():
                self.stopped.wait(0.05)
                continue
            try:
                readable, _, _ = select.select([a, b], [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return self._close(a, b)
                    chance, longest = self.stalls
                    if (
                        sock is b and chance and self._random.random() < chance
                    ):  # b: the server's side
                        self.stopped.wait(self._random.uniform(0, longest))
                    peer[sock].sendall(data)
            except OSError:
                return self._close(a, b)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(5)
        with self._lock:
            self._close(*self._sockets)
