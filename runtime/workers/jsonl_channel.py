"""The JSON-lines side of a worker (standard library only): the reply channel, error replies and the
request loop every worker script in this folder runs (vllm_worker.py, vllm_data_worker.py,
llamacpp_worker.py). Imported by those scripts from their own folder, under whatever Python runs them:

    channel = protocol_channel()          # before the engine is imported: its logs go to stderr
    send(channel, {"ready": True})
    serve_requests(channel, lambda request: {...})   # until {"cmd": "quit"} or the end of stdin
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def protocol_channel():
    """A text stream on a private copy of stdout; fd 1 (and sys.stdout) now write to stderr, so an
    engine's logs, and those of the processes it spawns, never mix with the protocol."""
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w", buffering=1)  # os.dup: not inherited by spawned processes
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def send(channel, message: dict) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def error_reply(err: BaseException) -> dict:
    return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def serve_requests(channel, handle) -> None:
    """Answer each request line from stdin with handle(request); a failed request is answered with its
    error and the worker keeps serving."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if request.get("cmd") == "quit":
                return
            reply = handle(request)
        except Exception as err:
            reply = error_reply(err)
        send(channel, reply)
