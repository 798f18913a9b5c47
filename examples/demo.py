"""The whole loop on this machine (docs/integrating.md, "Run the demo"): authsvc's game-facing
service and admin API under gunicorn on one SQLite store, the demo platform and the reference game,
on loopback.

Makes ./var/demo-loop (a store with "Demo Game", an admin API token with players:write and
tokens:mint, a throwaway token secret, the game's webhook for player.renamed and player.deleted)
on the first run and keeps it; delete it to start over. Starts `authsvc deliver` too (the game's
port allowed on loopback). Prints the one URL to open; Ctrl-C stops all five. Run by scripts/demo.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORTS = {"authsvc": 8000, "admin": 8081, "platform": 8100, "game": 8200}


def wait_for(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"demo: nothing listens on 127.0.0.1:{port} (is the port taken?)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--var", default=str(REPO / "var" / "demo-loop"), help="where the demo keeps its state"
    )
    for name, port in PORTS.items():
        parser.add_argument(f"--{name}-port", type=int, default=port)
    args = parser.parse_args(argv)
    ports = {name: getattr(args, f"{name}_port") for name in PORTS}
    var = Path(args.var).resolve()
    var.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {
        **os.environ,
        "AUTHSVC_STORE": f"sqlite://{var}/authsvc.db",
        "AUTHSVC_TOKEN_SECRET_FILE": str(var / "token-secret"),
        "AUTHSVC_WEBHOOK_ALLOW_HOSTS": f"127.0.0.1:{ports['game']}",
    }
    bin_dir = Path(sys.executable).parent
    os.umask(0o077)
    if not (var / "game.json").exists():
        (var / "token-secret").write_text(secrets.token_hex(32) + "\n")

        def authsvc(*args: str) -> dict:
            out = subprocess.run(
                [str(bin_dir / "authsvc"), *args, "--json"],
                env=env,
                check=True,
                capture_output=True,
            )
            return json.loads(out.stdout)

        authsvc("init")
        game = authsvc("game", "add", "Demo Game")
        (var / "api-key").write_text(game["api_key"])
        (var / "admin-token").write_text(
            authsvc(
                "api-token",
                "add",
                "demo-platform",
                "--scope",
                "players:write",
                "--scope",
                "tokens:mint",
            )["token"]
        )
        hook = authsvc(
            "webhook",
            "add",
            f"http://127.0.0.1:{ports['game']}/webhooks/authsvc",
            "--event",
            "player.renamed",
            "--event",
            "player.deleted",
        )
        (var / "webhook-secret").write_text(hook["secret"])
        (var / "game.json").write_text(json.dumps({"game_id": game["game_id"]}))
    game_id = json.loads((var / "game.json").read_text())["game_id"]
    py, bind = sys.executable, "127.0.0.1:{}".format

    def url(port: int) -> str:
        return "http://" + bind(port)

    commands = {
        "authsvc": [
            py,
            "-m",
            "gunicorn",
            "--bind",
            bind(ports["authsvc"]),
            "--workers",
            "1",
            "--no-control-socket",
            "authsvc.wsgi:application",
        ],
        "admin": [
            py,
            "-m",
            "gunicorn",
            "--bind",
            bind(ports["admin"]),
            "--workers",
            "1",
            "--no-control-socket",
            "authsvc.api.wsgi:application",
        ],
        "platform": [
            py,
            "-m",
            "examples.platform",
            "--port",
            str(ports["platform"]),
            "--db",
            str(var / "platform.db"),
            "--admin-url",
            url(ports["admin"]),
            "--admin-token-file",
            str(var / "admin-token"),
            "--game-id",
            str(game_id),
            "--game-url",
            url(ports["game"]) + "/play",
        ],
        "game": [
            py,
            "-m",
            "examples.game",
            "--db",
            str(var / "game.db"),
            "serve",
            "--port",
            str(ports["game"]),
            "--authsvc-url",
            url(ports["authsvc"]),
            "--api-key-file",
            str(var / "api-key"),
            "--platform-url",
            url(ports["platform"]) + "/",
            "--webhook-secret-file",
            str(var / "webhook-secret"),
        ],
        "deliver": [str(bin_dir / "authsvc"), "deliver"],  # no port: started, not waited for
    }
    procs = []
    try:
        for name, command in commands.items():
            log = (var / f"{name}.log").open("ab")
            procs.append(
                subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
            if name in ports:
                wait_for(ports[name], procs[-1])
        print(
            f"\nThe demo loop runs (logs in {var}). Open:\n\n    {url(ports['platform'])}/\n\n"
            "sign up, play, change the password, sign out ... Ctrl-C stops it.",
            flush=True,
        )
        signal.signal(
            signal.SIGTERM, signal.default_int_handler
        )  # a kill stops the four as Ctrl-C does
        while all(proc.poll() is None for proc in procs):
            time.sleep(1)
        raise SystemExit("demo: a server stopped; see its log in " + str(var))
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)


if __name__ == "__main__":
    main()
