"""The admin API's OpenAPI document (authsvc/openapi/admin.json) as the JavaScript and TypeScript
ecosystems read it: docs/admin-api.md promises that a client generated from it refuses what the
service would, in any language.

The names rule (authsvc/names.py) is in the document as patterns. JSON Schema 2020-12 patterns are
ECMA-262 regular expressions with the ``u`` flag, as Ajv (JavaScript's validator) compiles them by
default; Python's ``re`` reads them too (jsonschema and schemathesis use it). Here the same names go
through the service's checker, the document's schemas in Python (jsonschema) and in Node (Ajv), and
all three must agree; so do audit cursors. openapi-typescript generates types from the document, and
the example TypeScript client (examples/clients/admin-client.ts) type-checks against them and runs.

The Node packages come from package-lock.json (scripts/test runs npm ci); without node or them,
these tests go through skip_or_fail (failures under AUTHSVC_TEST_STRICT=1, as in CI).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.errors import Invalid
from authsvc.names import check_game_name, check_username
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from tests.support import NODE_MODULES, free_port, node_tool, serve_gunicorn

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "authsvc" / "openapi" / "admin.json"
ALL_SCOPES = [
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
    "webhooks:read",
    "webhooks:write",
]

# Valid and invalid by the rules of authsvc/names.py: letters of several scripts, characters outside
# the BMP, white space inside and at either end (visible and not), each hidden category (Cc, Cf, Cs,
# Zl, Zp; the characters tests/functional/test_cli.py refuses; not a lone surrogate:
# tests/integration/test_admin_openapi.py's SURROGATES says why no pattern names one), a trailing
# newline (Python's "$" alone lets one through), the length bounds.
USERNAMES = [
    "alice",
    "bob",
    "Ursula",
    "demo_player",
    "a b",
    "Zo\u00eb",
    "\u540d\u524d",
    "\u05e9\u05dc\u05d5\u05dd",
    "e\u0301",
    "\U0001f3ae gamer",
    "\U0001d49clice",
    "x\U000e0100",
    "\U0010fffd",
    "\ufffd",
    "a\u00a0b",
    "a\u3000b",
    "x" * 255,
    "\U0001f3ae" * 255,
    "",
    " ",
    " alice",
    "alice ",
    "\u3000x",
    "x\u00a0",
    "\u2003x",
    "x\u1680",
    "alice\n",
    "a\tb",
    "\ta",
    "a\u202eb",
    "a\u200bb",
    "a\u2028b",
    "a\u2029b",
    "\ufeffa",
    "a\u2066b",
    "a\u00adb",
    "a\x1bb",
    "a\x07b",
    "a\x00b",
    "a\x7fb",
    "a\x85b",
    "a\U000e0001b",
    "a\U0001d173b",
    "a\U000110bdb",
    "\U000e007f",
    "x" * 256,
    "\U0001f3ae" * 256,
]
GAME_NAMES = [
    "Chess",
    " Chess 2 ",
    "\u2003" + "x" * 200 + " ",
    "x" * 200,
    "\u3000\u5c06\u68cb\u3000",
    "\U0001f3ae",
    "",
    "   ",
    "x" * 201,
    "\t Chess",
    "Chess\n",
    "Ch\u202eess",
    "\U000e0001Chess",
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
    """(schema, body, whether the service's checker takes the name) for every name and each schema
    it goes in."""
    cases = []
    for name in USERNAMES:
        ok = _accepts(check_username, name)
        cases += [
            ("PlayerPut", {"username": name}, ok),
            ("BatchPlayer", {"user_id": 1, "username": name}, ok),
        ]
    cases += [("GameAdd", {"name": name}, _accepts(check_game_name, name)) for name in GAME_NAMES]
    return cases


def test_names_agree_in_the_checker_the_document_in_python_and_ajv(tmp_path):
    node, _ = node_tool("ajv")
    schemas = {name: _schemas()[name] for name in ("PlayerPut", "BatchPlayer", "GameAdd")}
    cases = _cases()
    assert {ok for _, _, ok in cases} == {True, False}
    (tmp_path / "ajv.js").write_text(AJV_DRIVER)
    done = subprocess.run(
        [node, "ajv.js"],
        cwd=tmp_path,
        env={"NODE_PATH": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=60,
        input=json.dumps({"schemas": schemas, "cases": [c[:2] for c in cases]}),
    )
    assert done.returncode == 0, done.stderr
    in_ajv = json.loads(done.stdout)
    differ = []
    for (schema, body, ok), ajv_ok in zip(cases, in_ajv, strict=True):
        python_ok = jsonschema.Draft202012Validator(schemas[schema]).is_valid(body)
        if not ok == python_ok == ajv_ok:
            differ.append((schema, body, {"checker": ok, "python": python_ok, "ajv": ajv_ok}))
    assert not differ, differ


# Audit cursors: the service's rule is a whole number from 1 to 2^63-1, ASCII digits, no sign, no
# leading zero (authsvc/api/routes.py); each pattern alternative's edge on both sides.
CURSORS = [
    "1",
    "9",
    "10",
    "123",
    "999999999999999999",
    "1000000000000000000",
    "8999999999999999999",
    "9199999999999999999",
    "9223372036854775799",
    "9223372036854775806",
    "9223372036854775807",
    "0",
    "07",
    "-1",
    "+1",
    "1.0",
    "1e3",
    "",
    " 1",
    "12\n",
    "\u0661\u0662",
    "9223372036854775808",
    "9223372036854775810",
    "9223372036854775900",
    "9300000000000000000",
    "10000000000000000000",
    "99999999999999999999",
]


@pytest.mark.engine("sqlite")
def test_the_audit_cursor_agrees_in_the_service_python_and_ajv(tmp_path, settings, admin_store):
    """AuditPage.next and the after parameter are one schema, AuditCursor: a string, as the service
    answers next. Its pattern takes what GET /v1/audit takes as after, in Python and in Ajv."""
    node, _ = node_tool("ajv")
    schema = _schemas()["AuditCursor"]
    _, token = api_tokens.add_api_token(
        admin_store, Context(actor="cli:test"), "auditor", ["audit:read"]
    )
    app = webtest.TestApp(AdminApp(settings), lint=True)
    try:
        taken = [
            app.get(
                "/v1/audit",
                {"after": value},
                headers={"Authorization": f"Bearer {token}"},
                expect_errors=True,
            ).status_int
            == 200
            for value in CURSORS
        ]
    finally:
        app.app.store.close()
    assert {True, False} == set(taken) and all(status for status in taken[:11])
    (tmp_path / "ajv.js").write_text(AJV_DRIVER)
    done = subprocess.run(
        [node, "ajv.js"],
        cwd=tmp_path,
        env={"NODE_PATH": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=60,
        input=json.dumps(
            {"schemas": {"AuditCursor": schema}, "cases": [["AuditCursor", c] for c in CURSORS]}
        ),
    )
    assert done.returncode == 0, done.stderr
    in_python = [jsonschema.Draft202012Validator(schema).is_valid(value) for value in CURSORS]
    in_ajv = json.loads(done.stdout)
    assert in_python == taken == in_ajv, list(zip(CURSORS, taken, in_python, in_ajv, strict=True))


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
    """Every code point but the lone surrogates (tests/integration/test_admin_openapi.py's
    SURROGATES), alone and between two letters, through Ajv and through the service's checker; the
    same sweep in Python's ``re`` is tests/integration/test_admin_openapi.py's."""
    node, _ = node_tool("ajv")
    schemas = _schemas()
    properties = {
        "PlayerPut.username": (schemas["PlayerPut"]["properties"]["username"], check_username),
        "BatchPlayer.username": (schemas["BatchPlayer"]["properties"]["username"], check_username),
        "GameAdd.name": (schemas["GameAdd"]["properties"]["name"], check_game_name),
    }
    (tmp_path / "sweep.js").write_text(AJV_SWEEP)
    done = subprocess.run(
        [node, "sweep.js"],
        cwd=tmp_path,
        env={"NODE_PATH": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=120,
        input=json.dumps({"schemas": {k: v[0] for k, v in properties.items()}}),
    )
    assert done.returncode == 0, done.stderr
    taken = json.loads(done.stdout)
    differ = []
    for name, (_, check) in properties.items():
        for form, make in (("alone", lambda c: c), ("inside", lambda c: "a" + c + "b")):
            in_ajv = set()
            for first, last in taken[f"{name} {form}"]:
                in_ajv.update(range(first, last + 1))
            differ += [
                (name, form, f"U+{code:04X}")
                for code in range(0x110000)
                if not 0xD800 <= code <= 0xDFFF
                and (code in in_ajv) != _accepts(check, make(chr(code)))
            ]
    assert not differ, differ[:20]


CLIENT = REPO / "examples" / "clients" / "admin-client.ts"
# Beside the example client: what a web tier writes with it, and what the document refuses, each
# marked @ts-expect-error, so a document that lets one through (Batch.players typed unknown[], the
# audit cursor a number) fails the type check as surely as one that refuses good code.
USES = """
import type { components } from "./admin-api";
import { AdminClient } from "./admin-client";

declare const client: AdminClient;
// A batch item and a player without `enabled` (left out: true).
const item: components["schemas"]["BatchPlayer"] = { user_id: 42, username: "alice" };
const player: components["schemas"]["PlayerPut"] = { username: "alice" };

export async function sync(): Promise<void> {
  await client.batchPlayers([item, { user_id: 43, username: "bob", enabled: false }]);
  await client.putPlayer(42, player);
  await client.rotateGameKey(1);
  const page = await client.audit({ limit: 10, player: 42 });
  if (page.next !== null) await client.audit({ after: page.next });
  // @ts-expect-error a batch item's username is a string
  await client.batchPlayers([{ user_id: 44, username: 7 }]);
  // @ts-expect-error a batch item names its user_id
  await client.batchPlayers([{ username: "carol" }]);
  // @ts-expect-error a player has a username
  await client.putPlayer(45, { enabled: false });
  // @ts-expect-error the audit cursor is a string: an id above 2^53 does not fit a number
  await client.audit({ after: 12 });
  // @ts-expect-error /v1/audit has no such filter
  await client.audit({ colour: "red" });
}
"""


def _generate_types(node: str, generator: Path, where: Path) -> None:
    """admin-api.d.ts in ``where``: openapi-typescript's types of the document, with its default
    options."""
    done = subprocess.run(
        [node, str(generator / "bin" / "cli.js"), str(DOCUMENT), "-o", "admin-api.d.ts"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout


def test_the_typescript_client_type_checks_against_types_generated_from_the_document(tmp_path):
    """openapi-typescript (its default options) makes the types from the document; tsc --strict
    checks the example web-tier client (examples/clients/admin-client.ts, a method per admin
    operation) and USES against them. Run outside the repository: openapi-typescript reads the
    redocly.yaml where it runs, and the repository's writes each API's types into build/
    (redocly.yaml)."""
    node, generator = node_tool("openapi-typescript")
    _, typescript = node_tool("typescript")
    document = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    # Each method of the client names the operation it calls ("(GET /v1/players/{user_id})"): one
    # for each.
    operations = {
        f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item
    }
    assert {
        name
        for name in operations
        if not re.search(re.escape(f"({name}") + "[);:]", CLIENT.read_text())
    } == set()
    _generate_types(node, generator, tmp_path)
    (tmp_path / "admin-client.ts").write_text(CLIENT.read_text())
    (tmp_path / "uses.ts").write_text(USES)
    done = subprocess.run(
        [
            node,
            str(typescript / "bin" / "tsc"),
            "--noEmit",
            "--strict",
            "--target",
            "es2022",
            "--module",
            "es2022",
            "--moduleResolution",
            "bundler",
            "--lib",
            "es2022,dom",
            "admin-client.ts",
            "uses.ts",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# Every method of the example client once, against the live service: what the type check cannot see
# (a HEAD's answer has no body, a 404 and a 412 come back as AdminError, the cursor goes from page
# to page).
DRIVER = """
import { AdminClient, AdminError } from "./admin-client";

declare const process: { env: Record<string, string | undefined>; exitCode: number };
const print = (step: string, value: unknown) => console.log(JSON.stringify({ step, value }));

async function main(): Promise<void> {
  const client = new AdminClient(
    process.env.AUTHSVC_ADMIN_URL ?? "", process.env.AUTHSVC_ADMIN_TOKEN ?? "");
  const signup = await client.putPlayer(777, { username: "newbie" });
  print("putPlayer", signup);
  print("playerEtag", await client.playerEtag(777));
  print("getPlayer", await client.getPlayer(777));
  print("rename", await client.putPlayer(777, { username: "veteran", enabled: true }, signup.etag));
  try {
    await client.putPlayer(777, { username: "again" }, signup.etag);
    print("stale rename", "no error");
  } catch (error) {
    if (!(error instanceof AdminError)) throw error;
    print("stale rename", { status: error.status, type: error.problem.type });
  }
  print("revokePlayer", await client.revokePlayer(777));
  print("batchPlayers", await client.batchPlayers(
    [{ user_id: 778, username: "bob" }, { user_id: 779, username: " bad" }], true));
  const game = await client.addGame("TypeScript Chess");
  print("addGame", game);
  print("getGame", await client.getGame(game.game_id));
  print("gameExists",
    [await client.gameExists(game.game_id), await client.gameExists(game.game_id + 1000)]);
  print("setGameEnabled", [(await client.setGameEnabled(game.game_id, false)).enabled,
                           (await client.setGameEnabled(game.game_id, true)).enabled]);
  print("mintToken", await client.mintToken(game.game_id, 777));
  print("rotateGameKey", await client.rotateGameKey(game.game_id, 60));
  print("audit", await client.audit({ limit: 2 }));
  const actions: string[] = [];
  for await (const record of client.auditRecords({ player: 777, limit: 1 }))
    actions.push(record.action);
  print("auditRecords", actions);
  print("canReadAudit", await client.canReadAudit());
  print("document", (await client.document()).openapi);
  print("documentLength", await client.documentLength());
  print("deletePlayer", await client.deletePlayer(777));
  const hook = await client.addWebhook(
    { url: "https://game.example.com/events", events: ["player.deleted"] });
  print("addWebhook", { id: hook.id, secret: hook.secret.startsWith("whsec_") });
  print("listWebhooks", (await client.listWebhooks()).map((h) => h.id));
  print("getWebhook", await client.getWebhook(hook.id));
  const page = await client.deliveries(hook.id, { state: "pending", limit: 10 });
  print("deliveries", page);
  try {
    await client.retryDelivery(hook.id, 1);
    print("retryDelivery", "no error");
  } catch (error) {
    if (!(error instanceof AdminError)) throw error;
    print("retryDelivery", { status: error.status, type: error.problem.type });
  }
  print("removeWebhook", await client.removeWebhook(hook.id));
}

main().catch((error) => { console.error(String(error)); process.exitCode = 1; });
"""


@pytest.mark.slow
@pytest.mark.engine("sqlite")
def test_the_typescript_client_calls_every_operation_of_the_live_service(
    tmp_path, env, admin_store
):
    """The example client, compiled by tsc against the generated types, calls each operation of the
    admin API under a real gunicorn on loopback (DRIVER), with a token holding every scope."""
    node, generator = node_tool("openapi-typescript")
    _, typescript = node_tool("typescript")
    _generate_types(node, generator, tmp_path)
    (tmp_path / "admin-client.ts").write_text(CLIENT.read_text())
    (tmp_path / "driver.ts").write_text(DRIVER)
    done = subprocess.run(
        [
            node,
            str(typescript / "bin" / "tsc"),
            "--strict",
            "--target",
            "es2022",
            "--module",
            "commonjs",
            "--moduleResolution",
            "node10",
            "--lib",
            "es2022,dom",
            "--outDir",
            "out",
            "admin-client.ts",
            "driver.ts",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _, token = api_tokens.add_api_token(
        admin_store, Context(actor="cli:test"), "web-tier", ALL_SCOPES
    )
    port = free_port()
    server = serve_gunicorn(
        env | {"AUTHSVC_ADMIN_RATE": "0"},
        port=port,
        log_path=tmp_path / "gunicorn.log",
        app="authsvc.api.wsgi:application",
        workers=1,
    )
    try:
        done = subprocess.run(
            [node, "out/driver.js"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"AUTHSVC_ADMIN_URL": f"http://127.0.0.1:{port}", "AUTHSVC_ADMIN_TOKEN": token},
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert token not in done.stdout + done.stderr
    steps = {line["step"]: line["value"] for line in map(json.loads, done.stdout.splitlines())}
    signup = steps["putPlayer"]
    assert (
        signup["created"] is True
        and signup["username"] == "newbie"
        and signup["etag"] == steps["playerEtag"]
    )
    assert steps["getPlayer"]["etag"] == signup["etag"]
    assert steps["rename"]["created"] is False and steps["rename"]["etag"] != signup["etag"]
    assert steps["stale rename"] == {
        "status": 412,
        "type": "urn:authsvc:problem:precondition-failed",
    }
    assert steps["revokePlayer"]["epoch"] == 1
    assert [r["status"] for r in steps["batchPlayers"]["results"]] == ["created", "error"]
    game_id = steps["addGame"]["game_id"]
    assert steps["getGame"]["name"] == "TypeScript Chess" and "api_key" not in steps["getGame"]
    assert steps["gameExists"] == [True, False] and steps["setGameEnabled"] == [False, True]
    assert steps["mintToken"]["game_id"] == game_id and steps["mintToken"]["epoch"] == 1
    assert steps["rotateGameKey"]["api_key"] != steps["addGame"]["api_key"]
    assert len(steps["audit"]["records"]) == 2 and isinstance(steps["audit"]["next"], str)
    assert steps["deletePlayer"]["user_id"] == 777 and steps["deletePlayer"]["deleted"] is True
    assert steps["auditRecords"] == ["token.mint", "player.revoke", "player.rename", "player.add"]
    assert steps["canReadAudit"] is True and steps["document"].startswith("3.1.")
    assert steps["documentLength"] > 0
    assert steps["addWebhook"]["secret"] is True and steps["listWebhooks"] == [
        steps["addWebhook"]["id"]
    ]
    assert (
        steps["getWebhook"]["events"] == ["player.deleted"] and "secret" not in steps["getWebhook"]
    )
    assert steps["deliveries"] == {"deliveries": [], "next": None}
    assert steps["retryDelivery"] == {"status": 404, "type": "urn:authsvc:problem:not-found"}
    assert steps["removeWebhook"] == {"id": steps["addWebhook"]["id"], "deleted": True}
