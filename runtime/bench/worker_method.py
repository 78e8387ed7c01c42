"""A bench method whose engine runs in another Python, behind the JSON-lines worker protocol: the shared
process handling of the vLLM (`vllm_method.py`) and llama.cpp (`llamacpp_method.py`) baselines.

A subclass builds the worker's command line and turns replies into BatchOutput; this class starts the
worker (its stderr to a temporary log), waits for its ready line, sends requests, and reads replies with
a timeout. Every failure names the worker's log (kept after a failure, removed otherwise) and quotes
its last lines; a worker that fails to load is bad input (exit 2) naming the method.

    class MyMethod(WorkerMethod):
        engine = "my engine"
    method._launch(cmd, env, timeout_s=600)    # -> the ready reply
    reply = method._request({"prompts": ...})  # -> the reply line, or DraftsmithError
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import sys
import tempfile
import time
import weakref
from pathlib import Path

from draftsmith.runtime.bench.types import Method
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.workers.worker_process import start_worker, stop_worker

FIELD = "--baselines"


def find_python(module: str, env_var: str, venv: str) -> str | None:
    """A Python that can import `module`: this one, $env_var, or ./venv/bin/python (None: none found)."""
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    if os.environ.get(env_var):
        return os.environ[env_var]
    local = Path.cwd() / venv / "bin" / "python"
    return str(local) if local.exists() else None


class WorkerMethod(Method):
    """Process handling of a worker-backed method; `engine` names it in messages."""

    engine = "worker"
    settle_s = 0.0  # idle time after each request, not timed (an engine that busy-waits after a request)

    def _setup(self, name: str) -> None:
        """State every worker method has: its name, a temporary folder (lives as long as the method) and
        the worker's log beside it."""
        self.name, self.failed, self.proc = name, False, None
        self.tmp = Path(tempfile.mkdtemp(prefix=f"draftsmith-{self.engine.replace('.', '')}-"))
        self._remove_tmp = weakref.finalize(self, shutil.rmtree, self.tmp, True)  # at close, or at exit
        self.log_path = self.tmp.with_name(self.tmp.name + ".log")  # the worker's stderr

    def _launch(self, cmd: list[str], env: dict[str, str], timeout_s: float) -> dict:
        """Start the worker and return its ready line; a worker that does not load is bad input."""
        self.proc, self.lines = start_worker(cmd, self.log_path, env)
        what = f"a {self.engine} worker that loads"
        try:
            ready = self._reply(timeout_s)
        except DraftsmithError as err:
            raise BadInputError(FIELD, self.name, what, str(err)) from None
        if not ready.get("ready"):
            raise BadInputError(FIELD, self.name, what, str(self._fail(ready.get("error", ready))))
        return ready

    def _request(self, request: dict) -> dict:
        """Send one request line and return the reply; an error reply or a dead worker raises."""
        if self.proc is None or self.proc.poll() is not None:
            raise DraftsmithError(f"{self.name}: the {self.engine} worker is not running")
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker died: _reply says how
            pass
        reply = self._reply()
        if "error" in reply:
            raise self._fail(f"{self.name}: {self.engine} failed: {reply['error']}")
        time.sleep(self.settle_s)  # not timed: the worker measured its own wall time
        return reply

    def _reply(self, timeout_s: float | None = None) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise self._fail(f"the {self.engine} worker did not answer in {timeout_s:.0f} s") from None
        if line is None:
            raise self._fail(f"the {self.engine} worker exited (code {self.proc.wait()})")
        try:
            return json.loads(line)
        except ValueError:
            raise self._fail(f"the {self.engine} worker wrote {line[:200]!r}, not a JSON line") from None

    def _fail(self, what: str) -> DraftsmithError:
        """The error to raise, with where the worker's log is (kept after a failure) and its last lines."""
        self.failed = True
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            return DraftsmithError(f"{what}; no worker log")
        return DraftsmithError(
            f"{what}; worker log {self.log_path} ends: " + " | ".join(x[-300:] for x in tail)
        )

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to quit, kill its process group if it does not or when something is left; remove
        the temporary folder, and the log unless the worker failed."""
        proc, self.proc = getattr(self, "proc", None), None
        if proc is not None:
            stop_worker(proc, timeout_s)
        if hasattr(self, "_remove_tmp"):
            self._remove_tmp()
        if not getattr(self, "failed", True):
            self.log_path.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.close(timeout_s=5.0)
