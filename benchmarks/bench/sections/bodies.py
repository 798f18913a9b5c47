"""Section bodies: in-process cost of the costliest request bodies of at most 16 KiB."""

from __future__ import annotations

import argparse
import io
import json
import time
import wsgiref.util
from pathlib import Path

from authsvc.settings import Settings
from authsvc.tokens import mint_token
from authsvc.web.app import make_app
from benchmarks.bench.world import PATH, PerCall, World


def run(world: World, args: argparse.Namespace, logs: Path, script: Path) -> None:
    """Each costly body against a plain form, the WSGI callable called directly; a fresh input per
    call."""
    from harness.hostile_bodies import curl_form, plain_form, worst_bodies

    app = make_app(Settings.from_env(world.env))
    uid = world.user_ids[0]
    params = {
        "user_id": str(uid),
        "game_auth_token": mint_token(world.secret, world.game_id, uid, 0),
        "api_key": world.api_key,
    }
    cases = [
        ("form: the three fields (the reference)", *plain_form(params)),
        ("multipart: the three fields, as curl -F sends them", *curl_form(params)),
        *worst_bodies(params),
    ]

    def start_response(status, headers, exc_info=None):
        return None

    def environ(body: bytes, content_type: str) -> dict:
        env = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": PATH,
            "QUERY_STRING": "",
            "CONTENT_TYPE": content_type,
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
        }
        wsgiref.util.setup_testing_defaults(env)
        return env

    answers = {}
    for (
        label,
        body,
        content_type,
    ) in cases:  # refuse to time a body the app does not answer as documented
        answer = json.loads(b"".join(app(environ(body, content_type), start_response)))
        success = label.endswith(("(the reference)", "curl -F sends them"))
        if answer.get("success") is not success or (
            not success and answer.get("error") not in (400, 403)
        ):
            raise SystemExit(f"bench: {label!r} answered {answer}")
        answers[label] = (
            "success" if success else f"{answer['error']}: {answer['error_description']}"
        )
    calls = max(args.calls // 20, 20)
    figures = {label: PerCall() for label, _, _ in cases}
    for _ in range(3):  # alternate, like the other sections
        for label, body, content_type in cases:
            for _ in range(5):
                envs = [environ(body, content_type) for _ in range(calls)]
                t0 = time.perf_counter()
                for env in envs:
                    b"".join(app(env, start_response))
                figures[label].figures.append((time.perf_counter() - t0) / calls * 1e6)
    app.store.close()
    reference = figures[cases[0][0]].best
    print(
        "\n7. Request bodies of at most 16 KiB: in-process cost per call (the WSGI callable called "
        "directly, a POST with a fresh input each call); 3 alternating rounds of 5 runs of "
        f"{calls} calls\n"
    )
    print("| body | bytes | answer | µs per call, best | median | best vs plain form |")
    print("|---|---|---|---|---|---|")
    for label, body, _ in cases:
        f = figures[label]
        print(
            f"| {label} | {len(body):,} | {answers[label]} | {f.best:.1f} | {f.median:.1f} | "
            f"{f.best / reference:.1f} |"
        )
    worst = max((label for label, _, _ in cases[1:]), key=lambda k: figures[k].best)
    print(
        "\nTarget: the costliest body within 10 x a plain form: "
        f"{figures[worst].best / reference:.1f} ({worst})"
    )
