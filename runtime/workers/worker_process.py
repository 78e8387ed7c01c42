"""A JSON-lines worker in another Python (vLLM's venv): start it in its own session, read its replies
from a thread, stop it and whatever it spawned. Used by the bench's vLLM method (`vllm_method.py`) and the
data steps on vLLM (`data_recipes/vllm_engine.py`); standard library only.

    proc, lines = start_worker(cmd, log_path, worker_env(python, defaults))
    line = lines.get(timeout=60)          # one reply line, None once the worker has exited
    stop_worker(proc, timeout_s=30)       # {"cmd": "quit"}, then SIGKILL of its process group
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path


def worker_env(python: str, defaults: dict[str, str]) -> dict[str, str]:
    """`defaults` under our environment (ours wins), with the venv's Intel OpenMP preloaded (vLLM-CPU asks
    for it)."""
    env = {**defaults, **os.environ}
    iomp = (Path(python).parent.parent / "lib" / "libiomp5.so").absolute()
    if iomp.is_file() and str(iomp) not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    return env


def start_worker(
    cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path | None = None
) -> tuple[subprocess.Popen, queue.Queue]:
    """Start `cmd` with stderr to `log_path`, in its own session (so stop_worker can end the engine
    processes it spawns too); its stdout lines arrive in the returned queue, then None."""
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stderr=log, env=env, cwd=cwd, start_new_session=True, **pipes)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    return proc, lines


def stop_worker(proc: subprocess.Popen, timeout_s: float) -> None:
    """Ask the worker to quit, then SIGKILL what is left of its process group (vLLM's engine processes)."""
    try:
        proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        proc.stdin.close()
        proc.wait(timeout=timeout_s)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _pump(stream, lines: queue.Queue) -> None:
    """The worker's stdout, line by line, into `lines`; None when it ends (the worker exited)."""
    for line in stream:
        lines.put(line)
    lines.put(None)
