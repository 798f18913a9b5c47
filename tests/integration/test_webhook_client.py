"""The deliverer's HTTP client (authsvc/webhooks/connect.py) against receivers on loopback: what it
refuses to reach, redirects, keep-alive, and its bounds on a receiver that never finishes."""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest

from authsvc.errors import Invalid
from authsvc.settings import host_list
from authsvc.webhooks.connect import Client
from authsvc.webhooks.target import check_url, public
from tests.support import Receiver

BODY = b'{"type":"player.created"}'


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "2002:7f00:1::1",
        "64:ff9b::a00:1",
    ],
)
def test_addresses_of_the_platform_s_own_networks_are_not_public(address):
    assert not public(ipaddress.ip_address(address))


# IPv6 forms that carry an IPv4 address, or that no public host has: each once passed as public.
SPECIAL_V6 = [
    "::127.0.0.1",
    "::10.0.0.1",
    "::8.8.8.8",  # IPv4-compatible (deprecated): refused, whatever it carries
    "::ffff:0:127.0.0.1",
    "::ffff:0:8.8.8.8",  # SIIT (IPv4-translated): refused
    "64:ff9b::7f00:1",
    "64:ff9b::a9fe:a9fe",  # NAT64's well-known prefix: judged by the IPv4 address
    "64:ff9b:1::7f00:1",
    "64:ff9b:1::808:808",
    "64:ff9b:1:ffff::1",  # local-use NAT64: refused
    "2002:a9fe:a9fe::1",
    "2002:c0a8:101::1",  # 6to4: judged by the IPv4 address
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:0:808:808::f7f7:f7f7",  # Teredo: refused
    "fec0::1",
    "feff:ffff::1",  # site-local (deprecated): refused
    "5f00::1",
    "4000::1",  # outside 2000::/3, where every public unicast address is
]


@pytest.mark.parametrize("address", SPECIAL_V6)
def test_special_ipv6_forms_are_judged_by_the_ipv4_address_they_carry_or_refused(address):
    assert not public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", SPECIAL_V6)
def test_a_name_resolving_to_a_special_ipv6_form_is_not_a_public_address(address):
    def resolve(host, port, type):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]

    answer = Client(resolve=resolve).post("https://hooks.example.com/x", BODY, {})
    assert (answer.status, answer.error) == (None, "not a public address")


@pytest.mark.parametrize("address", SPECIAL_V6)
def test_a_url_naming_a_special_ipv6_form_is_refused(address):
    with pytest.raises(Invalid) as refused:
        check_url(f"https://[{address}]/hook", frozenset())
    assert refused.value.detail == (
        "names an address outside the public internet (allowed only for a host in "
        "AUTHSVC_WEBHOOK_ALLOW_HOSTS)"
    )


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
        "2a00:1450:4001::1",
    ],
)
def test_internet_addresses_are_public(address):
    assert public(ipaddress.ip_address(address))


def test_a_name_that_resolves_to_loopback_is_refused_unless_its_host_and_port_are_allowed(receiver):
    url = receiver.url(host="localhost")
    answer = Client().post(url, BODY, {})
    assert (answer.status, answer.error) == (None, "not a public address")
    assert (
        answer.detail.startswith(f"localhost:{receiver.port} resolves to ")
        and "/hook" not in answer.detail
    )
    assert Client(host_list(f"localhost:{receiver.port + 1}, 127.0.0.1")).post(
        url, BODY, {}
    ).error == ("not a public address")
    assert receiver.requests == []
    answer = Client(host_list(f"example.org, localhost:{receiver.port}")).post(
        url, BODY, {"webhook-id": "msg_1"}
    )
    assert (answer.status, answer.error) == (200, None)
    ((headers, body),) = receiver.requests
    assert (
        body == BODY
        and headers["webhook-id"] == "msg_1"
        and headers["host"] == f"localhost:{receiver.port}"
    )


def test_every_address_a_name_gives_must_be_public():
    """A name whose answer mixes a public address with a private one is refused: no address is
    tried."""
    tried = []

    def resolve(host, port, type):
        tried.append(host)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", port)),
        ]

    answer = Client(resolve=resolve).post("https://hooks.example.com/x?token=s3cr3t", BODY, {})
    assert answer.error == "not a public address"
    assert answer.detail == (
        "hooks.example.com:443 resolves to 10.0.0.5, not a public address "
        "(AUTHSVC_WEBHOOK_ALLOW_HOSTS lists the hosts allowed anyway)"
    )
    assert tried == ["hooks.example.com"]


def test_a_redirect_is_a_failed_attempt_and_is_not_followed(receiver):
    elsewhere = Receiver()
    try:
        receiver.answer = lambda headers, body: (307, {"Location": elsewhere.url()})
        answer = Client({"127.0.0.1"}).post(receiver.url(), BODY, {})
        assert answer.status == 307
        assert answer.error == "answered 307 (redirects are not followed)"
        assert (
            answer.detail == f"127.0.0.1:{receiver.port} answered 307 (redirects are not followed)"
        )
        assert len(receiver.requests) == 1 and elsewhere.requests == []
    finally:
        elsewhere.close()


def test_https_verifies_the_certificate_against_the_url_s_host():
    """A certificate for the URL's host (SNI) is accepted; one for another name is refused, nothing
    sent."""
    import ssl

    import trustme

    ca = trustme.CA()
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    for names, ok in ((["localhost"], True), (["elsewhere.example"], False)):
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*names).configure_cert(server_context)
        receiver = Receiver(tls=server_context)
        try:
            client = Client({f"localhost:{receiver.port}"}, ssl_context=trusting)
            answer = client.post(receiver.url(host="localhost"), BODY, {})
            if ok:
                assert (answer.status, answer.error) == (200, None) and len(receiver.requests) == 1
            else:
                assert (answer.status, answer.error) == (None, "could not connect")
                assert answer.detail.startswith(
                    f"localhost:{receiver.port}: TLS certificate not valid for the host ("
                )
                assert receiver.requests == []
            client.close()
        finally:
            receiver.close()


def test_posts_to_one_host_share_a_kept_alive_connection(receiver):
    client = Client({"127.0.0.1"})
    peers = set()
    receiver.answer = lambda headers, body: 204
    original = receiver.server.RequestHandlerClass.do_POST

    def do_post(handler):
        peers.add(handler.client_address)
        original(handler)

    receiver.server.RequestHandlerClass.do_POST = do_post
    for _ in range(5):
        assert client.post(receiver.url(), BODY, {}).status == 204
    assert len(receiver.requests) == 5 and len(peers) == 1
    client.close()


def test_a_receiver_that_never_finishes_its_answer_costs_at_most_the_timeout():
    """Its head comes, then its body a byte at a time: the attempt ends at the timeout, failed."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def drip():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        while not stop.wait(0.2):
            try:
                conn.sendall(b"x")
            except OSError:
                break
        conn.close()

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        answer = Client({"127.0.0.1"}, timeout=1.0).post(f"http://127.0.0.1:{port}/", BODY, {})
        assert (answer.status, answer.error, answer.detail) == (
            None,
            "timed out",
            f"127.0.0.1:{port}: no answer (timed out)",
        )
    finally:
        stop.set()
        listener.close()
        thread.join(5)


# -- bounds: what a hostile receiver's answer, or a slow resolver, can cost
# --------------------------


def _hostile(head: bytes, chunk: bytes, cap: int = 256 * 1024 * 1024):
    """A raw receiver on 127.0.0.1 that answers ``head`` then sends ``chunk`` over and over until
    the client goes away (or ``cap`` bytes); (port, sent(), close)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent = [0]
    done = threading.Event()

    def serve():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.settimeout(30)
        try:
            conn.recv(65536)
            conn.sendall(head)
            while sent[0] < cap and not done.is_set():
                sent[0] += conn.send(chunk)
        except OSError:
            pass  # the client closed: what it had not read stays unsent
        finally:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close():
        done.set()
        listener.close()
        thread.join(30)

    return port, lambda: sent[0], close


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNK = b"ffff\r\n" + b"x" * 0xFFFF + b"\r\n"  # a valid chunk of 64 KiB - 1


@pytest.mark.parametrize(
    "size", [b"-7fffffffffffffff", b"-1", b"1" + b"0" * 40, b"0x10", b"+10", b"1_0", b"zz", b""]
)
def test_a_chunk_size_that_is_not_plain_hex_fails_the_attempt_and_the_read_stops(size):
    """A negative chunk size once lifted the 64 KiB bound: a receiver streaming after it was read to
    the timeout (tens of MiB). Now the answer is not HTTP: the attempt fails, the connection is
    closed at once."""
    port, sent, close = _hostile(CHUNKED + size + b"\r\n", CHUNK)
    try:
        answer = Client({"127.0.0.1"}, timeout=5.0).post(f"http://127.0.0.1:{port}/", BODY, {})
    finally:
        close()
    assert (answer.status, answer.error) == (None, "the answer is not valid HTTP")
    # What the client read is at most ~80 KiB; the kernel's buffers on both sides hold the rest of
    # what was sent.
    assert sent() < 16 * 1024 * 1024


@pytest.mark.parametrize(
    "head",
    [
        CHUNKED + b"ffffffffffffffff\r\n",  # one chunk far over the bound
        CHUNKED + b"ffff\r\n" + b"x" * 65535 + b"\r\nffff\r\n",  # two within it, their sum over it
        b"HTTP/1.1 200 OK\r\nContent-Length: 9999999999\r\n\r\n",
    ],
)
def test_a_body_over_64_kib_is_not_read_past_the_bound_and_its_status_counts(head):
    port, sent, close = _hostile(head, CHUNK)
    try:
        answer = Client({"127.0.0.1"}, timeout=5.0).post(f"http://127.0.0.1:{port}/", BODY, {})
    finally:
        close()
    assert (answer.status, answer.error) == (200, None)
    assert sent() < 16 * 1024 * 1024


def test_endless_interim_answers_are_bounded_like_a_head():
    """103 Early Hints, over and over: each is a head, and together they are one (at most 16
    KiB)."""
    port, sent, close = _hostile(
        b"", b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n" * 1000
    )
    try:
        answer = Client({"127.0.0.1"}, timeout=5.0).post(f"http://127.0.0.1:{port}/", BODY, {})
    finally:
        close()
    assert (answer.status, answer.error) == (None, "the answer is not valid HTTP")
    assert sent() < 16 * 1024 * 1024


def test_name_resolution_is_bounded_by_the_attempt_s_timeout():
    """A resolver slower than the timeout (here: one that answers only when the test ends) once held
    the attempt for as long as it took. The seam: Client's ``resolve`` (socket.getaddrinfo in the
    deliverer)."""
    release = threading.Event()
    calls = []

    def stuck(host, port, type):
        calls.append(host)
        release.wait(120)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", port))]

    client = Client(resolve=stuck, connect_timeout=1.0, timeout=1.0)
    answers = []
    thread = threading.Thread(
        target=lambda: answers.append(client.post("https://hooks.example.com/x", BODY, {})),
        daemon=True,
    )
    thread.start()
    thread.join(30)  # the attempt's bound is 1 s; 30 s for a busy machine
    try:
        assert not thread.is_alive(), "the attempt waited for the resolver past its timeout"
        assert calls == ["hooks.example.com"]
        assert (answers[0].status, answers[0].error) == (None, "could not connect")
    finally:
        release.set()
        client.close()
