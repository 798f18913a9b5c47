"""The admin API's OpenAPI document (authsvc/openapi/admin.json) as the JavaScript and TypeScript
ecosystems read it: docs/admin-api.md promises that a client generated from it refuses what the
service would, in any language.

The names rule (authsvc/names.py) is in the document as patterns. JSON Schema 2020-12 patterns are
ECMA-262 regular expressions with the ``u`` flag, as Ajv (JavaScript's validator) compiles them by
default; Python's ``re`` reads them too (jsonschema and schemathesis use it). Here the same names go
through the service's checker, the document's schemas in Python (jsonschema) and in Node (Ajv), and
all three must agree.

The Node packages come from package-lock.json (scripts/test runs npm ci); without node or them, these
tests go through skip_or_fail (failures under AUTHSVC_TEST_STRICT=1, as in CI).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema

from authsvc.errors import Invalid
from authsvc.names import check_game_name, check_username
from tests.support import NODE_MODULES, node_tool

REPO = Path(__file__).resolve().parent.parent
DOCUMENT = REPO / "authsvc" / "openapi" / "admin.json"

# Valid and invalid by the rules of authsvc/names.py: letters of several scripts, characters outside
# the BMP, white space inside and at either end (visible and not), each hidden category (Cc, Cf, Cs,
# Zl, Zp; the characters tests/test_cli.py refuses; not a lone surrogate: tests/test_admin_openapi.py's
# SURROGATES says why no pattern names one), a trailing newline (Python's "$" alone lets one through),
# the length bounds.
USERNAMES = [
    "alice", "bob", "Ursula", "demo_player", "a b", "Zo\u00eb", "\u540d\u524d", "\u05e9\u05dc\u05d5\u05dd", "e\u0301",
    "\U0001f3ae gamer", "\U0001d49clice", "x\U000e0100", "\U0010fffd", "\ufffd", "a\u00a0b", "a\u3000b",
    "x" * 255, "\U0001f3ae" * 255,
    "", " ", " alice", "alice ", "\u3000x", "x\u00a0", "\u2003x", "x\u1680", "alice\n", "a\tb", "\ta",
    "a\u202eb", "a\u200bb", "a\u2028b", "a\u2029b", "\ufeffa", "a\u2066b", "a\u00adb", "a\x1bb", "a\x07b",
    "a\x00b", "a\x7fb", "a\x85b", "a\U000e0001b", "a\U0001d173b", "a\U000110bdb", "\U000e007f", "x" * 256, "\U0001f3ae" * 256,
]
GAME_NAMES = [
    "Chess", " Chess 2 ", "\u2003" + "x" * 200 + " ", "x" * 200, "\u3000\u5c06\u68cb\u3000", "\U0001f3ae",
    "", "   ", "x" * 201, "\t Chess", "Chess\n", "Ch\u202eess", "\U000e0001Chess",
]

AJV_DRIVER = """
const Ajv2020 = require("ajv/dist/2020");
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const ajv = new Ajv2020();  // the defaults: the u flag (unicodeRegExp: true), strict mode
const validators = {};
for (const [name, schema] of Object.entries(input.schemas)) validators[name] = ajv.compile(schema);
console.log(JSON.stringify(input.cases.map(([name, data]) => validators[name](data))));
"""


def _schemas() -> dict:
    return json.loads(DOCUMENT.read_text(encoding="utf-8"))["components"]["schemas"]


def _accepts(check, name: str) -> bool:
    try:
        check(name)
    except Invalid:
        return False
    return True


def _cases() -> list[tuple[str, dict, bool]]:
    """(schema, body, whether the service's checker takes the name) for every name and each schema it goes in."""
    cases = []
    for name in USERNAMES:
        ok = _accepts(check_username, name)
        cases += [("PlayerPut", {"username": name}, ok), ("BatchPlayer", {"user_id": 1, "username": name}, ok)]
    cases += [("GameAdd", {"name": name}, _accepts(check_game_name, name)) for name in GAME_NAMES]
    return cases


def test_names_agree_in_the_checker_the_document_in_python_and_ajv(tmp_path):
    node, _ = node_tool("ajv")
    schemas = {name: _schemas()[name] for name in ("PlayerPut", "BatchPlayer", "GameAdd")}
    cases = _cases()
    assert {ok for _, _, ok in cases} == {True, False}
    (tmp_path / "ajv.js").write_text(AJV_DRIVER)
    done = subprocess.run([node, "ajv.js"], cwd=tmp_path, env={"NODE_PATH": str(NODE_MODULES)}, capture_output=True,
                          text=True, timeout=60, input=json.dumps({"schemas": schemas, "cases": [c[:2] for c in cases]}))
    assert done.returncode == 0, done.stderr
    in_ajv = json.loads(done.stdout)
    differ = []
    for (schema, body, ok), ajv_ok in zip(cases, in_ajv, strict=True):
        python_ok = jsonschema.Draft202012Validator(schemas[schema]).is_valid(body)
        if not ok == python_ok == ajv_ok:
            differ.append((schema, body, {"checker": ok, "python": python_ok, "ajv": ajv_ok}))
    assert not differ, differ


AJV_SWEEP = """
const Ajv2020 = require("ajv/dist/2020");
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const ajv = new Ajv2020();
const out = {};
for (const [name, schema] of Object.entries(input.schemas)) {
  const validate = ajv.compile(schema);
  for (const [form, make] of [["alone", (c) => c], ["inside", (c) => "a" + c + "b"]]) {
    const taken = [];  // [first, last] code point of each run that validates
    let start = -1;
    for (let code = 0; code <= 0x110000; code++) {
      const ok = code < 0x110000 && validate(make(String.fromCodePoint(code)));
      if (ok && start < 0) start = code;
      if (!ok && start >= 0) { taken.push([start, code - 1]); start = -1; }
    }
    out[name + " " + form] = taken;
  }
}
console.log(JSON.stringify(out));
"""


def test_every_character_alone_and_inside_a_name_agrees_in_ajv(tmp_path):
    """Every code point but the lone surrogates (tests/test_admin_openapi.py's SURROGATES), alone and
    between two letters, through Ajv and through the service's checker; the same sweep in Python's
    ``re`` is tests/test_admin_openapi.py's."""
    node, _ = node_tool("ajv")
    schemas = _schemas()
    properties = {"PlayerPut.username": (schemas["PlayerPut"]["properties"]["username"], check_username),
                  "BatchPlayer.username": (schemas["BatchPlayer"]["properties"]["username"], check_username),
                  "GameAdd.name": (schemas["GameAdd"]["properties"]["name"], check_game_name)}
    (tmp_path / "sweep.js").write_text(AJV_SWEEP)
    done = subprocess.run([node, "sweep.js"], cwd=tmp_path, env={"NODE_PATH": str(NODE_MODULES)}, capture_output=True,
                          text=True, timeout=120, input=json.dumps({"schemas": {k: v[0] for k, v in properties.items()}}))
    assert done.returncode == 0, done.stderr
    taken = json.loads(done.stdout)
    differ = []
    for name, (_, check) in properties.items():
        for form, make in (("alone", lambda c: c), ("inside", lambda c: "a" + c + "b")):
            in_ajv = set()
            for first, last in taken[f"{name} {form}"]:
                in_ajv.update(range(first, last + 1))
            differ += [(name, form, f"U+{code:04X}") for code in range(0x110000)
                       if not 0xD800 <= code <= 0xDFFF and (code in in_ajv) != _accepts(check, make(chr(code)))]
    assert not differ, differ[:20]
