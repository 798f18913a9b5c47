"""Every link and citation in the repository leads somewhere, and every quoted command exists.

A section renamed or dropped in a merge leaves links to it that still look right
(docs/stores.md once lost "Bounded staleness" while five documents and the code
pointed at it); a command quoted in the docs that the parser does not know
sends an operator to an error. So, over the files git tracks:

- each relative Markdown link resolves to a tracked file or folder, and each
  ``#anchor`` (same file or another) to a heading of the target, by GitHub's
  rule for heading ids;
- each ``docs/X.md#anchor`` in code, configs and scripts does too;
- each section cited by name (``docs/stores.md, "The -wal file"``, the form the
  code and docs mostly use) or by number (``BENCHMARKS.md section 8``) is a
  heading, or a bold paragraph lead (``**Clocks.**``), of that document;
- each ``authsvc ...`` command in inline code or a fenced block of a Markdown
  file names subcommands and long options that ``authsvc.cli.command.build_parser``
  knows (positional values are placeholders and are not checked).
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import unicodedata
import urllib.parse

import pytest

from authsvc.cli import command as cli
from tests.support import skip_or_fail

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS_FILE = os.path.relpath(os.path.abspath(__file__), ROOT)


# -- the files -----------------------------------------------------------------------------------


def tracked_files() -> list[str]:
    """The files git tracks and the working tree holds (the repository as a clone has it)."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        skip_or_fail("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [
        name
        for name in out.decode("utf-8").split("\0")
        if name and os.path.isfile(os.path.join(ROOT, name))
    ]


def read_text(name: str) -> str | None:
    """A tracked file's text, None for a binary file."""
    with open(os.path.join(ROOT, name), "rb") as f:
        data = f.read()
    return None if b"\0" in data else data.decode("utf-8", errors="replace")


# -- Markdown: code, headings, links -------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=[\"']([^\"']+)[\"']", re.IGNORECASE)
BOLD_LEAD = re.compile(r"^\s*(?:[-*]\s+|\d+\.\s+)?\*\*([^*]+?)[.:]?\*\*")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+[\"'(][^)]*)?\)"
)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)


def split_code(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
    """(line number, line) outside fenced code blocks, and (line number, line, info string) inside
    them."""
    prose: list[tuple[int, str]] = []
    code: list[tuple[int, str, str]] = []
    fence, info = "", ""
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence:
            if (
                match
                and match.group(1)[0] == fence[0]
                and len(match.group(1)) >= len(fence)
                and not line.strip()[len(match.group(1)) :].strip()
            ):
                fence = ""
            else:
                code.append((number, line, info))
        elif match:
            fence, info = match.group(1), line.strip()[len(match.group(1)) :].strip()
        else:
            prose.append((number, line))
    return prose, code


def heading_text(raw: str) -> str:
    """A heading as GitHub renders it to text: links to their text, no code or emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = text.replace("`", "")
    return re.sub(r"(\*\*|__|(?<!\w)[*_]|[*_](?!\w))", "", text)


def slug(text: str) -> str:
    """GitHub's id for a heading's text: lower case; every character but letters, marks, numbers,
    connector punctuation (``_``), spaces and hyphens dropped; each space a hyphen."""
    kept = "".join(
        c
        for c in text.strip().lower()
        if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc"
    )
    return kept.replace(" ", "-")


def headings(text: str) -> list[str]:
    """The text of each heading, in order (fenced code is not a heading)."""
    prose, _ = split_code(text)
    found = []
    for _, line in prose:
        match = ATX_HEADING.match(line)
        if match:
            found.append(heading_text(match.group(2)))
    return found


def anchors(text: str) -> set[str]:
    """The ids a link may name in a Markdown file: each heading's slug (a repeated one gets -1, -2,
    ...) and explicit ``<a name=...>`` / ``<a id=...>``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    prose, _ = split_code(text)
    found.update(m.group(1) for _, line in prose for m in HTML_ANCHOR.finditer(line))
    return found


def without_code_spans(text: str) -> str:
    """The text with every inline code span blanked (same length, same line breaks)."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def markdown_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of each inline link, image and reference definition outside code."""
    prose, _ = split_code(text)
    lines = {number: line for number, line in prose}
    # Blank the fenced blocks but keep the line numbers, then blank the code spans (they may wrap).
    numbered = "\n".join(lines.get(n, "") for n in range(1, len(text.splitlines()) + 1))
    plain = without_code_spans(numbered)
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEFINITION):
        for match in pattern.finditer(plain):
            target = match.group(1).strip()
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            found.append((plain.count("\n", 0, match.start()) + 1, target))
    return sorted(found)


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


# -- where a link or citation leads --------------------------------------------------------------


class Repo:
    """The tracked files, and the anchors and section names of each Markdown file, read once."""

    def __init__(self, names: list[str]):
        self.names = names
        self.files = set(names)
        self.folders = {posixpath.dirname(n) for n in names}
        for folder in list(self.folders):
            while folder:
                folder = posixpath.dirname(folder)
                self.folders.add(folder)
        self._anchors: dict[str, set[str]] = {}
        self._sections: dict[str, list[str]] = {}

    def text(self, name: str) -> str:
        return read_text(name) or ""

    def anchors(self, name: str) -> set[str]:
        if name not in self._anchors:
            self._anchors[name] = anchors(self.text(name))
        return self._anchors[name]

    def sections(self, name: str) -> list[str]:
        """A document's headings and bold paragraph leads, lower case, whitespace collapsed."""
        if name not in self._sections:
            text = self.text(name)
            prose, _ = split_code(text)
            found = headings(text) + [
                heading_text(m.group(1)) for _, line in prose if (m := BOLD_LEAD.match(line))
            ]
            self._sections[name] = [" ".join(s.lower().split()) for s in found]
        return self._sections[name]

    def markdown(self) -> list[str]:
        return [n for n in self.names if n.endswith(".md")]

    def resolve(self, source: str, path: str) -> str | None:
        """The tracked file or folder a relative link of ``source`` names (None: nothing)."""
        path = urllib.parse.unquote(path)
        joined = (
            posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
            if not path.startswith("/")
            else posixpath.normpath(path.lstrip("/"))
        )
        if joined in self.files or joined.rstrip("/") in self.folders:
            return joined
        return None

    def cited(self, source: str, document: str) -> str | None:
        """The document a citation ``docs/X.md`` or ``X.md`` names: from the root, else beside the
        citing file, else in docs/ (code cites "stores.md" meaning docs/stores.md only in docs/
        itself)."""
        for candidate in (
            document,
            posixpath.join(posixpath.dirname(source), document),
            "docs/" + document,
        ):
            candidate = posixpath.normpath(candidate)
            if candidate in self.files:
                return candidate
        return None

    def link_problem(self, source: str, target: str) -> str | None:
        """Why a relative link ``target`` in ``source`` leads nowhere (None: it resolves)."""
        path, _, fragment = target.partition("#")
        if path:
            resolved = self.resolve(source, path)
            if resolved is None:
                return f"no tracked file or folder {path!r}"
        else:
            resolved = source
        if fragment:
            if not resolved.endswith(".md"):
                return None  # an anchor into code (GitHub's #L10 line links) is not checked
            if urllib.parse.unquote(fragment) not in self.anchors(resolved):
                return f"no heading in {resolved} has the id #{fragment}"
        return None


@pytest.fixture(scope="module")
def repo() -> Repo:
    return Repo(tracked_files())


# -- prose citations: docs/X.md, "Section" / X.md section 8 / docs/X.md#anchor ------------------

DOC = r"(?<![\w/.-])((?:docs/)?(?:[A-Za-z][\w-]*)\.md)"
CITED_BY_NAME = re.compile(DOC + r"(?:,\s*|\s+\(\s*|\s+)[\"“]([^\"”]+)[\"”]")
CITED_BY_NUMBER = re.compile(DOC + r"\)?,?\s*\(?(?:sections?|s\.|§)\s*(\d+[a-z]?)\b")
CITED_BY_ANCHOR = re.compile(DOC + r"#([\w%-]+)")
CITED_FILE = re.compile(r"(?<![\w/.-])((?:docs/[\w-]+|README|BENCHMARKS)\.md)\b")
COMMENT_CONTINUATION = re.compile(r"[ \t]*\n[ \t]*(?:#+|--|//|;+|\*)?[ \t]*")


def flowing(name: str, text: str) -> str:
    """Text with line breaks (and, in code, the comment marks that continue a comment) as single
    spaces, so a citation wrapped over two lines reads as one."""
    if name.endswith(".md"):
        return " ".join(text.split())
    return " ".join(COMMENT_CONTINUATION.sub(" ", text).split())


def section_problem(
    repo: Repo, source: str, document: str, section: str, by_number: bool
) -> str | None:
    """Why a citation of ``section`` in ``document`` leads nowhere (None: a heading or bold lead
    starts so)."""
    target = repo.cited(source, document)
    if target is None:
        return f"no tracked file {document}"
    wanted = " ".join(section.lower().split())
    for name in repo.sections(target):
        if by_number:
            if re.match(rf"{re.escape(wanted)}[.,: ]", name):
                return None
            continue
        unnumbered = re.sub(r"^\d+[a-z]?[.,]?\s+", "", name)
        for candidate in (name, unnumbered):
            if (
                candidate.startswith(wanted)
                and not candidate[len(wanted) : len(wanted) + 1].isalnum()
            ):
                return None
    return f"{target} has no section {'numbered ' if by_number else ''}{section!r}"


def citation_problems(repo: Repo, name: str, text: str) -> list[str]:
    """Every citation in a file that leads nowhere, as 'file: citation: why'."""
    text = flowing(name, text)
    problems = []
    for match in CITED_BY_NAME.finditer(text):
        problem = section_problem(repo, name, match.group(1), match.group(2), by_number=False)
        if problem:
            problems.append(f"{name}: {match.group(0)!r}: {problem}")
    for match in CITED_BY_NUMBER.finditer(text):
        problem = section_problem(repo, name, match.group(1), match.group(2), by_number=True)
        if problem:
            problems.append(f"{name}: {match.group(0)!r}: {problem}")
    for match in (
        () if name.endswith(".md") else CITED_BY_ANCHOR.finditer(text)
    ):  # Markdown: its links' test
        target = repo.cited(name, match.group(1))
        if target is None:
            problems.append(f"{name}: {match.group(0)!r}: no tracked file {match.group(1)}")
        elif urllib.parse.unquote(match.group(2)) not in repo.anchors(target):
            problems.append(
                f"{name}: {match.group(0)!r}: no heading in {target} has the id #{match.group(2)}"
            )
    for match in CITED_FILE.finditer(text):
        if match.group(1) not in repo.files:
            problems.append(f"{name}: {match.group(0)!r}: no tracked file {match.group(1)}")
    return problems


# -- authsvc commands quoted in Markdown ---------------------------------------------------------

SHELL_BLOCKS = {
    "",
    "sh",
    "bash",
    "shell",
    "console",
    "shell-session",
    "text",
}  # not ini, toml, nginx, sql, ...
SEGMENT_BREAK = re.compile(r"&&|\|\||[;|]|\$\(|[()]")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
WRAPPERS = {
    "sudo": {"-u", "-g"},
    "runuser": {"-u", "-g"},
    "env": set(),
    "time": {"-f"},
    "exec": set(),
    "nohup": set(),
    "/usr/bin/time": {"-f"},
}


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment, comments=True)
    except ValueError:  # an unbalanced quote in a sketch of a command line
        return segment.split("#", 1)[0].split()


def command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each inline code span and each line of a fenced block (joined over
    trailing backslashes), where an ``authsvc`` command may be quoted."""
    prose, code = split_code(text)
    found: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line, info in code:
        if info.split(" ", 1)[0].lower() not in SHELL_BLOCKS:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        found.append((start, pending + line))
        pending = ""
    lines = {number: line for number, line in prose}
    numbered = "\n".join(lines.get(n, "") for n in range(1, len(text.splitlines()) + 1))
    for match in CODE_SPAN.finditer(numbered):
        found.append((numbered.count("\n", 0, match.start()) + 1, " ".join(match.group(2).split())))
    return sorted(found)


def authsvc_commands(code: str) -> list[list[str]]:
    """The argument lists of each ``authsvc`` command in a line of shell (after a prompt, ``sudo``,
    ``runuser -u U --``, variable assignments; in each part of a pipeline or list)."""
    found = []
    for segment in SEGMENT_BREAK.split(code):
        words = _words(segment)
        while words:
            word = words[0]
            if word in ("$", "#", "%") or ASSIGNMENT.match(word):
                words = words[1:]
            elif word in WRAPPERS:
                takes_value = WRAPPERS[word]
                words = words[1:]
                while words and words[0].startswith("-"):
                    option = words.pop(0)
                    if option == "--":
                        break
                    if option in takes_value and words:
                        words.pop(0)
            else:
                break
        if words and posixpath.basename(words[0]) == "authsvc":
            found.append(words[1:])
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def command_problem(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Why ``authsvc ARGS`` is not a command the parser knows (None: it is). Subcommands must exist
    at each level; a long option (``--x`` or ``--x=v``, also in ``[...]``) must be one of that
    level's; anything else is a value or a placeholder (FILE, USER_ID, ...) and is not checked, as
    is the word after an option that takes a value (``authsvc audit --player USER_ID verify``:
    USER_ID is no subcommand)."""
    path = ["authsvc"]
    value_next = (
        False  # the word after an option that takes a value is that value, not a subcommand
    )
    for word in args:
        word = word.strip("[]")
        if value_next and not word.startswith("-"):
            value_next = False
            continue
        value_next = False
        if word.startswith("--"):
            if word == "--":
                break
            option = word.split("=", 1)[0]
            if option not in parser._option_string_actions:
                return f"'{' '.join(path)}' has no option {option}"
            value_next = "=" not in word and parser._option_string_actions[option].nargs != 0
            continue
        if word.startswith("-") and word != "-":
            if word[:2] not in parser._option_string_actions:
                return f"'{' '.join(path)}' has no option {word[:2]}"
            continue
        choices = _subparsers(parser)
        if choices is None:
            continue  # a value: leaves are not checked further
        if word not in choices:
            return (
                f"'{' '.join(path)}' has no subcommand {word!r} (it has: "
                f"{', '.join(sorted(choices))})"
            )
        parser = choices[word]
        path.append(word)
    return None


# -- unit tests of the checkers -------------------------------------------------------------------


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("Bounded staleness", "bounded-staleness"),
        ("The -wal file", "the--wal-file"),
        ("Why a request fails: `authsvc explain`", "why-a-request-fails-authsvc-explain"),
        ("8. Metrics cost", "8-metrics-cost"),
        ("2, re-measured on a quiet machine", "2-re-measured-on-a-quiet-machine"),
        (
            "Worked example: 10 million daily players, a 20× login peak",
            "worked-example-10-million-daily-players-a-20-login-peak",
        ),
        ("result=: the answer in the body", "result-the-answer-in-the-body"),
        ("The `authsvc_web` role's µs", "the-authsvc_web-roles-µs"),
        ("See [the API](api.md) **now**", "see-the-api-now"),
    ],
)
def test_slugs_follow_githubs_rule(heading, expected):
    assert slug(heading_text(heading)) == expected


def test_anchors_number_repeated_headings_and_ignore_code():
    text = '# Notes\n\n## Notes\n\n```sh\n# not a heading\n```\n\n### Notes\n<a name="here"></a>\n'
    assert anchors(text) == {"notes", "notes-1", "notes-2", "here"}


def test_links_are_found_outside_code_only():
    text = (
        "See [stores](stores.md#bounded-staleness) and ![x](img/a.png 'title').\n"
        "`[not](a-link.md)`\n\n```\n[nor](this.md)\n```\n[ref]: <api.md#health>\n"
        "[wrapped\nover lines](admin.md) and [https](https://example.com/x)\n"
    )
    assert markdown_links(text) == [
        (1, "img/a.png"),
        (1, "stores.md#bounded-staleness"),
        (7, "api.md#health"),
        (8, "admin.md"),
        (9, "https://example.com/x"),
    ]


def test_a_missing_file_or_anchor_is_a_problem(repo):
    assert repo.link_problem("docs/api.md", "stores.md#outages") is None
    assert repo.link_problem("docs/api.md", "../README.md#layout") is None
    assert repo.link_problem("README.md", "deploy/") is None
    assert "no tracked file" in repo.link_problem("docs/api.md", "store.md")
    assert "#no-such-section" in repo.link_problem("docs/api.md", "stores.md#no-such-section")
    assert "#Outages" in repo.link_problem("docs/api.md", "stores.md#Outages")  # ids are lower case
    assert "#nowhere" in repo.link_problem("docs/api.md", "#nowhere")


def test_citations_by_name_number_and_anchor_are_checked(repo):
    good = (
        'x (docs/stores.md, "Outages") y docs/operations.md, "Monitoring" (docs/stores.md, "Hot\n'
        '# standby") BENCHMARKS.md section 8, docs/logs.md, "Why a login failed" '
        'docs/stores.md#outages docs/stores.md ("pgbouncer") docs/scaling.md, "Clocks"'
    )
    assert (
        citation_problems(
            repo, "authsvc/x.py", good.replace('"Clocks"', '"Reading from hot standbys"')
        )
        == []
    )
    bad = (
        'docs/stores.md, "Nowhere" BENCHMARKS.md section 99 docs/stores.md#nowhere docs/nothing.md '
        'docs/stores.md, "Outage" docs/stores.md, "Clocks"'
    )
    problems = citation_problems(repo, "authsvc/x.py", bad)
    assert len(problems) == 5, problems  # "Clocks" is a bold lead of stores.md: a section
    assert all(p.startswith("authsvc/x.py: ") for p in problems)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("authsvc game show 7", [["game", "show", "7"]]),
        ("$ sudo -u authsvc AUTHSVC_CONFIG=/etc/a.toml authsvc init", [["init"]]),
        ("runuser -u authsvc -- sqlite3 /var/lib/authsvc/authsvc.db", []),
        ("journalctl -u authsvc --since -1h | grep x", []),
        ("cd /tmp && /usr/local/bin/authsvc export f.jsonl  # a comment", [["export", "f.jsonl"]]),
        ("/usr/bin/time -f '%e s %M KB' authsvc export|import FILE", [["export"]]),
        ("authsvc_web", []),
        ("authsvc.wsgi:application", []),
    ],
)
def test_commands_are_found_in_shell_lines(line, expected):
    assert authsvc_commands(line) == expected


@pytest.mark.parametrize(
    "args, known",
    [
        (["player", "add", "1001", "demo_player"], True),
        (["game", "list", "--json"], True),
        (["token", "issue", "--game", "G", "--user", "U"], True),
        (["game", "rotate-key", "G", "--old-key-ttl=60"], True),
        (["player"], True),
        (["--help"], True),
        (["game", "show", "7"], False),
        (["gmae", "list"], False),
        (["token", "issue", "--gmae", "1"], False),
        (["game", "list", "[--jsn]"], False),
        (["audit", "[--player", "USER_ID]", "[--json]"], True),
        (["audit", "--since", "30d", "verify"], True),
        (["audit", "--since", "30d", "verfy"], False),
    ],
)
def test_the_command_check_knows_the_parser(args, known):
    assert (command_problem(cli.build_parser(), args) is None) == known


def test_code_spans_and_fenced_blocks_are_read_for_commands():
    text = (
        "Run `authsvc player\nrevoke 42`.\n\n```sh\nsudo authsvc game \\\n  list --json\n```\n"
        "authsvc game show in prose is not checked\n"
    )
    found = [(n, args) for n, line in command_lines(text) for args in authsvc_commands(line)]
    assert found == [(1, ["player", "revoke", "42"]), (5, ["game", "list", "--json"])]


# -- the repository
# ---------------------------------------------------------------------------------


def test_every_relative_markdown_link_and_anchor_resolves(repo):
    problems = []
    for name in repo.markdown():
        for number, target in markdown_links(repo.text(name)):
            if not target or is_external(target):
                continue
            problem = repo.link_problem(name, target)
            if problem:
                problems.append(f"{name}:{number}: ({target}): {problem}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_cited_document_and_section_exists(repo):
    """In every tracked text file: Markdown, code comments and docstrings, configs, scripts."""
    problems = []
    for name in repo.names:
        if name == THIS_FILE:  # holds broken citations on purpose
            continue
        text = read_text(name)
        if text is not None:
            problems += citation_problems(repo, name, text)
    assert not problems, "citations that lead nowhere:\n" + "\n".join(problems)


def test_every_authsvc_command_quoted_in_markdown_exists(repo):
    parser = cli.build_parser()
    problems, checked = [], 0
    for name in repo.markdown():
        for number, line in command_lines(repo.text(name)):
            for args in authsvc_commands(line):
                checked += 1
                problem = command_problem(parser, args)
                if problem:
                    problems.append(f"{name}:{number}: `authsvc {' '.join(args)}`: {problem}")
    assert checked > 50, (
        checked
    )  # the docs quote the command often: finding none means the finder broke
    assert not problems, "commands the parser does not know:\n" + "\n".join(problems)
