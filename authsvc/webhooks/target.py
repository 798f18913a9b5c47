"""What a webhook's URL may be, checked when a subscription is made (docs/admin-api.md, "Webhooks").

An absolute ``https://`` URL of at most 2,048 characters, with no userinfo (a password in a URL
ends up in logs) and no fragment (never sent). Plain ``http://``, or a host that is a literal
address outside the public internet (loopback, private, link-local, CGNAT, ... ; also the short
and numeric IPv4 forms the resolver reads as one, ``10.1`` or ``167772161``), only when the URL's
``host`` or ``host:port`` is in AUTHSVC_WEBHOOK_ALLOW_HOSTS: a test receiver, a game server on
the LAN. A name is checked again where it matters, at each connection, against the addresses it
resolves to (authsvc/webhooks/connect.py).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Collection

from authsvc.errors import Invalid

MAX_URL = 2048
FIELD = "/url"


def _refused(reason: str) -> Invalid:
    return Invalid(reason, field=FIELD)


def literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names literally (any form the resolver reads as an IPv4 address), else
    None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


NAT64 = ipaddress.ip_network(
    "64:ff9b::/96"
)  # the well-known prefix: the IPv4 address is the last 32 bits
GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")  # every public IPv6 unicast address is in it
REFUSED_V6 = tuple(
    ipaddress.ip_network(n)
    for n in (
        "::/96",  # IPv4-compatible (deprecated), :: and ::1 too
        "::ffff:0:0:0/96",  # SIIT's IPv4-translated
        "64:ff9b:1::/48",  # local-use NAT64: a prefix of the platform's own network
        "2001::/32",  # Teredo: a tunnel through whatever relay
        "fec0::/10",  # site-local (deprecated)
    )
)


def public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """On the public internet. An IPv6 address that carries an IPv4 one to reach (IPv4-mapped,
    NAT64's well-known prefix, 6to4) is judged as that IPv4 address; the other forms that carry one
    (IPv4-compatible, SIIT, local-use NAT64, Teredo), site-local and anything outside 2000::/3 are
    refused."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return public(embedded)
        if address not in GLOBAL_UNICAST or any(address in net for net in REFUSED_V6):
            return False
    return address.is_global and not address.is_multicast


def check_url(url: str, allow_hosts: Collection[str]) -> str:
    """``url`` if a subscription may name it, else Invalid (field ``/url``); ``allow_hosts``: items
    of AUTHSVC_WEBHOOK_ALLOW_HOSTS (settings.host_list), ``host`` (any port) or ``host:port``."""
    if not isinstance(url, str) or not url:
        raise _refused("must be a URL")
    if len(url) > MAX_URL:
        raise _refused(f"must be at most {MAX_URL} characters")
    if not url.isascii() or not url.isprintable() or " " in url:
        raise _refused(
            "must be ASCII with no spaces or control characters (an international name in punycode)"
        )
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unclosed "[" of an IPv6 address
        raise _refused("must be an absolute https:// URL with a valid host") from None
    if parts.scheme.lower() not in ("https", "http") or not parts.netloc:
        raise _refused("must be an absolute https:// URL")
    if "@" in parts.netloc:
        raise _refused("must not hold a user name or password")
    if "#" in url:
        raise _refused("must not hold a fragment (#...)")
    host = (parts.hostname or "").rstrip(".")
    try:
        port = parts.port
    except ValueError:
        raise _refused("has a port that is not a number from 1 to 65535") from None
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(
                host
            )  # what the brackets hold must be one (urlsplit checks little)
        except ValueError:
            raise _refused("must be an absolute https:// URL with a valid host") from None
    if not host or port == 0:
        raise _refused("must name a host (and a port from 1 to 65535, if any)")
    name = f"[{host}]" if ":" in host else host
    allowed = name in allow_hosts or (port is not None and f"{name}:{port}" in allow_hosts)
    if parts.scheme.lower() == "http" and not allowed:
        raise _refused("must be https:// (http:// only for a host in AUTHSVC_WEBHOOK_ALLOW_HOSTS)")
    address = literal_address(host)
    if address is not None and not public(address) and not allowed:
        raise _refused(
            "names an address outside the public internet (allowed only for a host in "
            "AUTHSVC_WEBHOOK_ALLOW_HOSTS)"
        )
    return url
