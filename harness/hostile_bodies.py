"""Request bodies built to make the body parsers work: the probe's, and the worst found since.

Shared by tests/functional/test_hostile.py, tests/integration/test_gunicorn.py,
tests/integration/test_admin_cost.py and the ``bodies`` section of the bench
(benchmarks/bench/sections/bodies.py, BENCHMARKS.md). Every body fits the game-facing endpoint's 16
KiB limit, but the admin API's costliest batch (4 MiB, its cap).
"""

from __future__ import annotations

import json
import urllib.parse

from authsvc.web.http import MAX_PARAMS, MAX_PARTS

LIMIT = 16384  # AUTHSVC_MAX_BODY_BYTES' default


def fill(prefix: bytes, unit: bytes, suffix: bytes, size: int = LIMIT) -> bytes:
    """prefix + as many units as fit in ``size`` bytes + suffix."""
    return prefix + unit * ((size - len(prefix) - len(suffix)) // len(unit)) + suffix


def plain_form(params: dict[str, str]) -> tuple[bytes, str]:
    """What most game servers send in a body: the three fields, urlencoded."""
    return urllib.parse.urlencode(params).encode(), "application/x-www-form-urlencoded"


def curl_form(params: dict[str, str]) -> tuple[bytes, str]:
    """What curl -F (and PHP curl with an array) sends."""
    boundary = b"------------------------7d2f0c1a9b3e4d5f"
    body = b"".join(
        b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
        % (boundary, k.encode(), v.encode())
        for k, v in params.items()
    )
    return body + b"--%s--\r\n" % boundary, "multipart/form-data; boundary=" + boundary.decode()


def nested_multipart(params: dict[str, str], sub_parts: int = 1900) -> tuple[bytes, str]:
    """The probe's: the fields, the api key's part a multipart/mixed of ``sub_parts`` empty parts
    (13 KB).

    email.parser spent ~200 ms on it; the api key inside is never read, so the answer is "missing".
    """
    fields = b"".join(
        b'--outer\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
        % (k.encode(), v.encode())
        for k, v in params.items()
        if k != "api_key"
    )
    nested = (
        b'--outer\r\nContent-Disposition: form-data; name="api_key"\r\n'
        b"Content-Type: multipart/mixed; boundary=i\r\n\r\n"
        + b"--i\r\n\r\n" * sub_parts
        + b"--i--\r\n"
    )
    return fields + nested + b"\r\n--outer--\r\n", "multipart/form-data; boundary=outer"


def many_parts(parts: int = 320) -> tuple[bytes, str]:
    """The probe's other body: ``parts`` tiny fields (320 in 16 KB; email.parser: ~100 ms)."""
    return (
        b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n" * parts + b"--b--\r\n",
        "multipart/form-data; boundary=b",
    )


def _parts(parts: list[bytes]) -> bytes:
    return b"".join(b"--b\r\n" + part + b"\r\n" for part in parts) + b"--b--\r\n"


def worst_bodies(params: dict[str, str]) -> list[tuple[str, bytes, str]]:
    """(label, body, Content-Type) of the costliest bodies of each kind found so far, each <= 16
    KiB."""
    multipart = "multipart/form-data; boundary=b"
    per_part = LIMIT // MAX_PARTS - 16
    semicolons = b"Content-Disposition: form-data" + b";" * 220 + b"; name=x\r\n\r\n1"
    # Right under each cap of docs/api.md: a 200-byte quoted name (of "n", which the
    # header searches stumble on), header lines up to 512 bytes, then a non-ASCII value.
    name = b'Content-Disposition: form-data; name="' + b"n" * 200 + b'"\r\n'
    head = fill(name, b"X:\n", b"\r\n\r\n", 510)
    everything = fill(head, "é".encode(), b"", per_part)
    boundary = b"a" * 70
    near_delimiters = fill(b"", b"\n--" + boundary[:-1] + b"X", b"\n--" + boundary + b"--\r\n")
    bodies = [
        (
            "multipart: the probe's nested multipart/mixed, 1,900 sub-parts",
            *nested_multipart(params),
        ),
        (f"multipart: the probe's 320 tiny parts (refused: more than {MAX_PARTS})", *many_parts()),
        (
            f"multipart: {MAX_PARTS} parts, each a Content-Disposition of 220 semicolons",
            _parts([semicolons] * MAX_PARTS),
            multipart,
        ),
        (
            f"multipart: {MAX_PARTS} parts, each a 200-byte name, 510 bytes of headers, "
            f"{len(everything) - len(head):,} bytes of non-ASCII value",
            _parts([everything] * MAX_PARTS),
            multipart,
        ),
        (
            "multipart: 16 KiB preamble of near-delimiters (70-byte boundary)",
            near_delimiters,
            "multipart/form-data; boundary=" + boundary.decode(),
        ),
        (
            "form: one value of 16 KiB of percent-escapes",
            fill(b"x=", b"%C3%A9", b""),
            "application/x-www-form-urlencoded",
        ),
        (
            f"form: {MAX_PARAMS} parameters, a 48-byte name and a 198-byte value of "
            "percent-escapes, and one 12 KiB value of them",
            b"&".join(
                [fill(b"", b"%C3%A9", b"=", 49) + fill(b"", b"%C3%A9", b"", 198)] * (MAX_PARAMS - 1)
            )
            + fill(b"&x=", b"%C3%A9", b"", 12288),
            "application/x-www-form-urlencoded",
        ),
        (
            f"form: 8,192 empty parameters (refused: more than {MAX_PARAMS})",
            fill(b"", b"a&", b""),
            "application/x-www-form-urlencoded",
        ),
        (
            f"JSON: 1,800 members (refused: more than {MAX_PARAMS})",
            json.dumps({f"{i:04d}": 1 for i in range(1800)}, separators=(",", ":")).encode(),
            "application/json",
        ),
        (
            f"JSON: {MAX_PARAMS} members, each ~1 KiB of \\u escapes",
            b"{"
            + b",".join(b'"k%d":"%s"' % (i, b"\\u00e9" * 168) for i in range(MAX_PARAMS))
            + b"}",
            "application/json",
        ),
        (
            "JSON: 16 KiB of nested arrays, no comma (refused: more than 16 '[' and '{')",
            fill(b'{"a":', b"[", b""),
            "application/json",
        ),
        (
            "JSON: 15 nested arrays around a 16 KiB number",
            fill(b'{"a":' + b"[" * 15, b"7", b"]" * 15 + b"}"),
            "application/json",
        ),
        ("JSON: a 16 KiB fraction", fill(b'{"a":0.', b"7", b"}"), "application/json"),
    ]
    for label, body, _ in bodies:
        assert len(body) <= LIMIT, (label, len(body))
    return bodies


def costliest_batch(first_id: int = 1_000_000) -> bytes:
    """The admin API's costliest body a caller may send: a dry-run batch of 1,000 players of 255
    characters outside the BMP (each written as two \\u escapes), then a string of escapes to the 4
    MiB cap; ~50 ms of a worker's CPU. Shared by tests/integration/test_admin_cost.py and the
    bench's admin-cost section."""
    players = [{"user_id": first_id + n, "username": "\U0001f600" * 255} for n in range(1000)]
    body = json.dumps({"players": players, "dry_run": True})
    room = (4 << 20) - len(body) - 20
    return (body[:-1] + ', "pad": "' + "\\u00e9" * (room // 6) + '"}').encode()
