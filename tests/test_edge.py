"""The shipped edge under hostile clients: one address's connection flood, malformed
requests that must still be answered in the service's JSON shape, TLS as a scanner sees it.

Real nginx + gunicorn (tests/deploy_support.py). The flood tests run their own stack
with a small ``worker_connections``, so exhaustion is reached with few sockets.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from tests.deploy_support import API_HOST, find_nginx, start_stack, stop
from tests.support import skip_or_fail

pytestmark = pytest.mark.slow

JSON_TYPE = "application/json; charset=utf-8"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("edge"))
    yield s
    stop(s.nginx)
    stop(s.gunicorn)


# -- point: TLS as a scanner sees it ----------------------------------------------------

# ssl-config.mozilla.org "intermediate", as OpenSSL names the suites (TLS 1.2 and 1.3).
MOZILLA_INTERMEDIATE = {
    "TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384", "DHE-RSA-CHACHA20-POLY1305",
}


def test_sslscan_sees_mozilla_intermediate(stack):
    sslscan = shutil.which("sslscan")
    if sslscan is None:
        skip_or_fail("sslscan is not installed (Debian: apt-get install sslscan)")
    done = subprocess.run(
        [sslscan, "--no-colour", f"--sni-name={API_HOST}", "--xml=-", f"127.0.0.1:{stack.https_port}"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    xml = done.stdout[done.stdout.index("<?xml"):]
    test = ET.fromstring(xml).find("ssltest")
    assert test is not None, xml[:2000]
    protocols = {(p.get("type"), p.get("version")): p.get("enabled") for p in test.iter("protocol")}
    assert protocols[("tls", "1.2")] == "1" and protocols[("tls", "1.3")] == "1", protocols
    for old in (("ssl", "2"), ("ssl", "3"), ("tls", "1.0"), ("tls", "1.1")):
        assert protocols.get(old) == "0", (old, protocols)
    ciphers = {(c.get("sslversion"), c.get("cipher")) for c in test.iter("cipher")}
    assert ciphers, xml[:2000]
    assert {version for version, _ in ciphers} <= {"TLSv1.2", "TLSv1.3"}, ciphers
    outside = {c for c in ciphers if c[1] not in MOZILLA_INTERMEDIATE}
    assert not outside, outside
    renegotiation = test.find("renegotiation")
    assert renegotiation is not None, xml[:2000]
    assert not (renegotiation.get("supported") == "1" and renegotiation.get("secure") == "0"), renegotiation.attrib
    # Key exchange groups: elliptic curves of at least 256 bits, no finite-field DH.
    groups = {g.get("name", "").split()[0] for g in test.iter("group")}
    assert groups and groups <= {"x25519", "secp256r1", "secp384r1"}, groups
    # Compression (CRIME): sslscan reports it only when its OpenSSL was built with zlib
    # (Debian's is not: "OpenSSL version does not support compression"). Without that
    # report, the server side must be an OpenSSL >= 1.1.0, which never negotiates it.
    compression = test.find("compression")
    if compression is not None:
        assert compression.get("supported") == "0", compression.attrib
    else:
        built = subprocess.run([find_nginx(), "-V"], capture_output=True, text=True).stderr
        versions = re.findall(r"(?:built with|running with) OpenSSL (\d+)\.(\d+)\.", built)
        assert versions and all((int(a), int(b)) >= (1, 1) for a, b in versions), built
