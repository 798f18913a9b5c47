"""Standard Webhooks signing (docs/integrating.md, "Events"): the three headers a receiver verifies.

``webhook-id`` is the message's id, the same on every retry of one event to one webhook, so a
receiver drops duplicates by it; ``webhook-timestamp`` is the attempt's time (unix seconds), which a
receiver checks against its clock to refuse replays; ``webhook-signature`` is ``v1,`` and the base64
HMAC-SHA256 of ``{id}.{timestamp}.{body}`` keyed by the secret's bytes (the base64 after
``whsec_``). Any Standard Webhooks library verifies it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret: its base64 part decoded (padding as the libraries add
    it)."""
    return base64.b64decode(secret.removeprefix(PREFIX) + "==")


def message_id(delivery_id: int) -> str:
    """One id per event and webhook (a delivery row), kept across retries and a re-drive."""
    return f"msg_{delivery_id}"


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, b"%s.%d.%s" % (msg_id.encode(), timestamp, body), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, msg_id, timestamp, body),
    }
