"""Game-generation worker: a child process that turns job lines into compiled games.

Run as a script (``python worker.py``), never imported by the parent: the parent starts
it with ``PYTHONHASHSEED=0`` because TextWorld's generators iterate over sets of strings,
so with a random hash seed the same challenge, settings and seed can compile to a
structurally different game (measured on tw-cooking). A fixed hash seed makes every
generation reproducible, whatever the worker generated before.

Protocol, one JSON object per line: the parent writes
``{"challenge", "settings", "seed", "dest", "tmp_root"}`` to stdin and reads
``{"ok": true, "seconds": s}`` or ``{"ok": false, "error": "..."}`` from stdout. The
game is compiled into a fresh folder under ``tmp_root`` and renamed to ``dest`` in one
step, so readers see either no game or a complete one. EOF on stdin ends the worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

GAME_FILE = "game.z8"


def generate(challenge: str, settings: dict[str, Any], seed: int, dest: str, tmp_root: str) -> None:
    """Compile one game into ``dest`` (atomically; a no-op if another process won)."""
    import textworld
    import textworld.challenges
    from textworld.generator import compile_game

    options = textworld.GameOptions()
    options.seeds = int(seed)
    os.makedirs(tmp_root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="gen-", dir=tmp_root)
    try:
        options.path = os.path.join(tmp, GAME_FILE)
        _, make, _ = textworld.challenges.CHALLENGES[challenge]
        compile_game(make(dict(settings), options), options)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not os.path.isfile(os.path.join(dest, GAME_FILE)):
                raise  # not the benign race where another process renamed first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def serve(requests: Any, replies: Any) -> None:
    for line in requests:
        job = json.loads(line)
        start = time.perf_counter()
        try:
            generate(job["challenge"], job["settings"], job["seed"], job["dest"], job["tmp_root"])
            reply = {"ok": True, "seconds": time.perf_counter() - start}
        except Exception as exc:  # reported to the parent, which raises it for the caller
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    if sys.flags.hash_randomization:
        sys.exit("worker.py must run with PYTHONHASHSEED=0 (game generation depends on it)")
    # SIGTERM (the parent shutting down) unwinds like an exception, so the temporary
    # folder of an unfinished game is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    # Keep the protocol on a private copy of stdout; anything the generator prints goes
    # to stderr instead of corrupting the reply stream.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
