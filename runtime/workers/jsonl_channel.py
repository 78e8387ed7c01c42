"""The JSON-lines side of a worker (standard library only): the reply channel, error replies, the engine's
start-up answer and the request loop every worker script in this folder runs (vllm_worker.py,
vllm_data_worker.py, llamacpp_worker.py). Imported by those scripts from their own folder, under whatever
Python runs them:

    channel = protocol_channel()          # before the engine is imported: its logs go to stderr
    engine = start_engine(channel, build, describe, warm_up)   # answers ready (or the error -> None)
    return serve_engine(channel, engine, handle)   # handle(engine, request) until {"cmd": "quit"}
"""

from __future__ import annotations

import json
import os
import sys
import time
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


def start_engine(channel, build, describe, warm_up=None):
    """Build the engine (`build()`) and warm it up (`warm_up(engine)`: one short request), then answer
    {"ready": true, **describe(engine), "init_s", "warmup_s"} and return the engine; or answer the error
    and return None."""
    try:
        t0 = time.perf_counter()
        engine = build()
        ready = {"ready": True, **describe(engine), "init_s": round(time.perf_counter() - t0, 3)}
        if warm_up is not None:
            t0 = time.perf_counter()
            warm_up(engine)
            ready["warmup_s"] = round(time.perf_counter() - t0, 3)
    except Exception as err:  # noqa: BLE001 (any failure to load is answered; the worker then exits)
        send(channel, error_reply(err))
        return None
    send(channel, ready)
    return engine


def serve_engine(channel, engine, handle) -> int:
    """The worker's exit code: 3 when `engine` did not start (start_engine answered why), else 0 once every
    request is answered with handle(engine, request) (serve_requests)."""
    if engine is None:
        return 3
    serve_requests(channel, lambda request: handle(engine, request))
    return 0
