"""The repository stands on its own: nothing in it cites a document it does not hold.

Code, configs and docs cite the project's own docs (docs/*.md, README.md,
BENCHMARKS.md). A design note, a spec, an issue tracker or a sibling checkout
("../shared") are not in the repository, so a reader cannot follow such a citation.
The wire rules live in docs/api.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.support import skip_or_fail

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS_FILE = os.path.relpath(os.path.abspath(__file__), ROOT)
# Written by npm, not by us: the Node packages' names and versions (package.json's pins), among
# them names such as "@asyncapi/specs" that read like a citation and are none.
GENERATED = {"package-lock.json"}

# The citation forms, matched precisely: "specification" (of HTTP, in RFC prose) and
# Java's "SecretKeySpec" are words of their own and do not match.
CITATIONS = [
    (
        "a design document",
        re.compile(r"\bDESIGN\b"),
    ),  # "DESIGN §2", "DESIGN.md"; upper case, as cited
    (
        "the spec",
        re.compile(r"\bspecs?\b", re.IGNORECASE),
    ),  # "the spec", "spec §4", "spec rule 4", "the spec's"
    ("an issue number", re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)),  # "issue 2", "issue #5"
    ("the issue", re.compile(r"\bthe issue's\b", re.IGNORECASE)),  # "the machine"
    ("a sibling checkout", re.compile(r"\.\./shared\b")),
]


def tracked_files() -> list[str]:
    """The files git tracks (the repository as a clone has it, nothing under .git or .venv)."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        skip_or_fail("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in out.decode("utf-8").split("\0") if name]


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line number, what is cited, the line) for each citation of a document outside the
    repository."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in CITATIONS:
            if pattern.search(line):
                found.append((number, what, line.strip()))
    return found


@pytest.mark.parametrize(
    "line",
    [
        "the 400/403 results of the spec come back with HTTP 200",
        "One test per rule of DESIGN §2.",
        "a 403 tells the game to reload (spec rule 4)",
        "see spec §4",
        "the spec's response-shapes table",
        "see the closing notes of issue 2",
        "| target (issue #5) |",
        "8 µs on the issue's machine",
        "settings shared with ../shared/authsvc.toml",
    ],
)
def test_each_citation_form_is_caught(line):
    assert citations(line)


@pytest.mark.parametrize(
    "line",
    [
        "the HTTP specification (RFC 9110) allows it",
        'new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256")',
        "authsvc token issue --game 1 --user 42",
        "every issued token is void",
        "ssl_session_cache shared:authsvc_tls:10m;",
        "the design of the store (docs/stores.md)",
        "RFC 2046 §5.1.1",
    ],
)
def test_prose_and_code_are_not_citations(line):
    assert not citations(line)


def test_no_tracked_file_cites_a_document_outside_the_repository():
    problems = []
    for name in tracked_files():
        if name == THIS_FILE or name in GENERATED:  # holds the forms it looks for; or npm wrote it
            continue
        path = os.path.join(ROOT, name)
        if not os.path.isfile(path):  # deleted in the working tree, not yet committed
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data:  # binary
            continue
        text = data.decode("utf-8", errors="replace")
        problems += [
            f"{name}:{number}: cites {what}: {line}" for number, what, line in citations(text)
        ]
    assert not problems, "cite docs/api.md or another project doc instead:\n" + "\n".join(problems)
