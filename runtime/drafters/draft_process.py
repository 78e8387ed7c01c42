"""The drafter in its own process (`--draft-process`, `--draft-device`), optionally with SSD (`--ssd`).

    drafter = RemoteDrafter(DraftConfig("smollm2-135m", "self:layers=10", depth=3, ssd_fanout=8))
    results = generate_speculative(target, drafter, prompts, params)     # the ordinary engine loop
    drafter.close()

The target's process (rank 0) runs the engine with this proxy; a second process (rank 1, started here with
`python -m draftsmith.runtime.drafters.draft_process CONFIG`) loads the target's tokenizer and the drafter
on its own device at tensor-parallel size 1 and serves it over a gloo pair of their own (`Link`: never the
default process group, which a split target's tensor-parallel group holds; the messages are small: tokens,
accepted node ids, and the laws q of sampled drafts). One cycle:

    target:   send (accepted ids of the last verdict, contexts) -> wait for drafts -> verify ... -> send ...
    drafter:  recv -> hit: cached draft / miss: commit + propose -> send drafts -> pre-speculate (SSD) -> recv

so with SSD the drafter drafts the next cycle's branches while the target verifies (runtime/drafters/ssd.py
holds the logic and its lossless argument; the drafts and laws cross the process boundary unchanged).
Without --ssd the remote drafter just drafts on request (nothing overlaps; the disaggregation alone).

A drafter process that dies (or stops answering within `timeout_s`) ends the generation with a
DraftProcessError naming it, before anything is printed; with `fallback` (`--draft-fallback`) the proxy
builds the drafter in process, restarts it on the current contexts (fresh random streams) and goes on.
The time the target waits for drafts is `target_idle_s` in `batch_metrics()`.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from draftsmith.runtime.drafters.drafter import Drafter
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.tree import Tree, chain

PROCESS_SPECS = ("ngram", "self:", "model:")  # drafters of the committed tokens only (no target features)


class DraftProcessError(DraftsmithError):
    """The drafter process died or stopped answering."""


@dataclass(frozen=True)
class DraftConfig:
    target: str  # the target spec (the drafter process loads the tokenizer and, for self:, the layers)
    draft: str  # --draft spec
    depth: int  # chain length K
    ssd_fanout: int = 0  # 0: no SSD
    device: str = "cpu"
    dtype: str = "auto"
    timeout_s: float = 120.0
    threads: int = 1  # torch threads in the drafter process
    saguaro: float = 1.0  # SSD's draft-law adjustment (runtime/drafters/ssd.py)
    interrupt: bool = True  # stop pre-drafting when the verdict arrives (False: every branch, reproducible)


def check_draft_device(device: str) -> str:
    """cpu, or cuda[:i] with such a device present."""
    kind, _, index = device.partition(":")
    if kind == "cpu" and not index:
        return device
    if kind == "cuda" and (not index or index.isdigit()):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index or 0) < count:
            return device
        raise BadInputError("--draft-device", device, f"a CUDA device present here ({count} found)")
    raise BadInputError("--draft-device", device, "cpu or cuda[:INDEX]")


def check_process_spec(spec: str) -> str:
    if spec == "ngram" or any(spec.startswith(p) and len(spec) > len(p) for p in PROCESS_SPECS[1:]):
        return spec
    raise BadInputError("--draft", spec, "ngram, self:layers=N or model:TARGET with --draft-process")


# ---- messages: pickled objects as uint8 tensors, length first ------------------------------------------
class Link:
    """The target's process (rank 0) and the drafter process (rank 1): a gloo pair of their own, never the
    default process group (a split target's tensor-parallel group holds that one)."""

    def __init__(self, store: dist.Store, rank: int, timeout_s: float):
        self.group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout_s))
        self.peer = 1 - rank

    @staticmethod
    def serve_store(timeout_s: float) -> dist.TCPStore:
        """Rank 0's rendezvous on a free port (`.port`), before the drafter process starts."""
        return dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=timeout_s), wait_for_workers=False)

    @staticmethod
    def join(port: int, timeout_s: float) -> Link:
        store = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=timeout_s))
        return Link(store, 1, timeout_s)

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.group.send([torch.tensor([len(data)], dtype=torch.long)], self.peer, 0).wait()
        self.group.send([torch.frombuffer(bytearray(data), dtype=torch.uint8)], self.peer, 0).wait()

    def recv(self, size: torch.Tensor | None = None):
        """The next object; `size` when its length has already arrived (`recv_size`, polled while
        speculating)."""
        if size is None:
            size = torch.zeros(1, dtype=torch.long)
            self.recv_size(size).wait()
        buf = torch.empty(int(size), dtype=torch.uint8)
        self.group.recv([buf], self.peer, 0).wait()
        return pickle.loads(buf.numpy().tobytes())  # our own peer: a trusted process we started

    def close(self) -> None:
        """Shut the pair down now, not at interpreter exit (a gloo pair torn down late can abort)."""
        self.group.shutdown()

    def recv_size(self, size: torch.Tensor):
        return self.group.recv([size], self.peer, 0)


def pack(draft: Draft) -> tuple:
    return draft.tree.parents, draft.tokens, draft.draft_probs


def unpack(packed: tuple) -> Draft:
    parents, tokens, probs = packed
    return Draft(Tree(tuple(parents)), list(tokens), probs)


# ---- the target's side ---------------------------------------------------------------------------------
class RemoteDrafter(Drafter):
    def __init__(self, config: DraftConfig, fallback: Callable[[], Drafter] | None = None):
        super().__init__()
        self.config, self.fallback = config, fallback
        self.tree, self.name = chain(config.depth), f"process:{config.draft}"
        self.local: Drafter | None = None  # the in-process drafter after a fallback
        self.accepted, self.rows = None, None
        self._metrics: list[dict] = []
        self.idle_s, self.trace = 0.0, []
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        store = Link.serve_store(self.config.timeout_s)
        cfg = json.dumps(asdict(self.config) | {"port": store.port})
        env = os.environ | {"OMP_NUM_THREADS": str(self.config.threads)}
        proc = subprocess.Popen([sys.executable, "-m", __name__, cfg], env=env)
        self.link = Link(store, 0, self.config.timeout_s)  # waits for the drafter process to join
        return proc

    def _exchange(self, msg: dict):
        if self.process.poll() is not None:
            raise DraftProcessError(f"the drafter process exited with code {self.process.returncode}")
        try:
            self.link.send(msg)
            return self.link.recv()
        except (RuntimeError, ConnectionError) as err:  # gloo: peer closed, or the timeout passed
            raise DraftProcessError(f"the drafter process stopped answering ({err})") from err

    def start(self, prompts, params, generators, features=None, static_slots=None) -> None:
        super().start(prompts, params, generators, features)
        if self._batch_started:
            self._metrics.append(self._close_batch())
        self._batch_started, self.idle_s, self.accepted, self.rows = True, 0.0, None, None
        self.ended_rows: list[int] = []
        if self.local is not None:
            return self.local.start(prompts, params, generators, features)
        states = None if generators is None else [g.get_state() for g in generators]
        msg = {"op": "start", "prompts": prompts, "params": params, "states": states}
        reply = self._guard(lambda: self._exchange(msg))
        if reply is None:
            return self.local.start(prompts, params, self._fresh_generators())
        if "bad_input" in reply or "error" in reply:  # the drafter could not be built there
            self.close(kill=True)
            if "bad_input" in reply:
                raise BadInputError(*reply["bad_input"])
            raise DraftProcessError(f"the drafter process could not start: {reply['error']}")

    _batch_started = False

    def propose(self, contexts: list[list[int]], tree=None) -> DraftBatch:
        """The remote drafter's chain of `depth` (its own budget), or the in-process fallback's."""
        if self.local is None:
            msg = {"op": "cycle", "accepted": self.accepted, "ended": self.ended_rows, "rows": self.rows}
            msg["contexts"] = contexts
            start = time.perf_counter()
            reply = self._guard(lambda: self._exchange(msg))
            self.idle_s += time.perf_counter() - start
            if reply is not None:
                self.accepted, self.ended_rows, self.rows = None, [], None
                self.forwards = reply["forwards"]
                return DraftBatch.from_drafts([unpack(d) for d in reply["drafts"]], "cpu")
            self.local.start(contexts, self.params, self._fresh_generators())  # it prefills the contexts
        return self.local.propose(contexts, self.local.tree)

    def commit(self, accepted, features=None, fetched=None) -> None:
        if self.local is not None:
            return self.local.commit(accepted, features, fetched)
        self.accepted = accepted

    def ended(self, rows: list[int]) -> None:
        if self.local is not None:
            return self.local.ended(rows)
        self.ended_rows = self.ended_rows + rows  # sent with the next cycle, before any retain

    def retain(self, rows: list[int]) -> None:
        super().retain(rows)
        if self.local is not None:
            return self.local.retain(rows)
        self.rows = rows

    def _guard(self, call):
        """Run an exchange; on a dead drafter fall back in process (when told) or raise."""
        try:
            return call()
        except DraftProcessError:
            if self.fallback is None:
                self.close(kill=True)
                raise
            self.close(kill=True)
            self.local = self.fallback()
            return None

    def _fresh_generators(self) -> list[torch.Generator] | None:
        """Random streams for the in-process drafter after a fallback: reusing the remote's initial states
        would reuse uniforms that already drew verified drafts."""
        if self.generators is None:
            return None
        fresh = []
        for g in self.generators:
            new = torch.Generator(device=g.device)
            new.manual_seed(int(torch.randint(2**62, (), generator=g)) ^ 0xFA11BAC)
            fresh.append(new)
        return fresh

    def _close_batch(self) -> dict:
        return {"target_idle_s": round(self.idle_s, 4), "fell_back": self.local is not None}

    def close(self, kill: bool = False) -> list[dict]:
        """Stop the drafter process -> per batch metrics (the drafter's merged with the target's wait)."""
        remote = []
        if self.process is not None and self.process.poll() is None and not kill:
            try:
                reply = self._exchange({"op": "stop"})
                remote, self.trace = reply["metrics"], reply["trace"]
            except DraftProcessError:
                remote = []
        if self.process is not None:
            if kill and self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self.process = None
        if getattr(self, "link", None) is not None:
            self.link.close()
            self.link = None
        ours = self._metrics + [self._close_batch()]
        self.metrics = [r | o for r, o in zip(remote, ours, strict=False)] or ours
        return self.metrics

    def batch_metrics(self) -> list[dict]:
        return getattr(self, "metrics", None) or self._metrics + [self._close_batch()]


# ---- the drafter's side ---------------------------------------------------------------------------------
class Listener(threading.Thread):
    """Receives the next message's length in the background and flags its arrival. (gloo's `irecv` work
    reports `is_completed()` False until waited on, even after the data is in: measured here, torch 2.x;
    a thread blocked in `wait` releases the GIL, so the branches keep running.)"""

    def __init__(self, link: Link, size: torch.Tensor):
        super().__init__(daemon=True)
        self.link, self.size, self.arrived = link, size, threading.Event()
        self.start()

    def run(self) -> None:
        self.link.recv_size(self.size).wait()
        self.at = time.perf_counter()
        self.arrived.set()


def serve(cfg: dict) -> None:
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.drafters.ssd import SsdDrafter, clone_factory

    torch.set_num_threads(cfg["threads"])
    # load first: the target's process waits in init_process_group, before its clock starts; a failure is
    # reported to it as the answer to its first message (so it never waits out the timeout)
    failure = None
    try:
        target = Target.load(cfg["target"], device=cfg["device"], dtype=cfg["dtype"])
        proto = build_drafter(cfg["draft"], target, chain(cfg["depth"]))
    except BadInputError as err:
        failure = {"bad_input": (err.field, err.got, err.expected, err.hint)}
    except Exception as err:  # noqa: BLE001 (any load failure ends the generation with its message)
        failure = {"error": f"{type(err).__name__}: {err}"}
    if failure is not None:
        link = Link.join(cfg["port"], cfg["timeout_s"])
        link.recv()
        link.send(failure)
        link.close()
        return
    drafter = proto
    if cfg["ssd_fanout"]:
        drafter = SsdDrafter(clone_factory(proto), cfg["depth"], cfg["ssd_fanout"], saguaro=cfg["saguaro"])
        drafter.defer = True  # branches are drafted after the drafts are sent
    link = Link.join(cfg["port"], cfg["timeout_s"])
    size = None  # a message length already received while speculating
    fetched = None  # the last proposal's `fetched` columns (the drafter's commit reads them)
    with torch.inference_mode():
        while True:
            msg = link.recv(size)
            size = None
            if msg["op"] == "stop":
                ssd = bool(cfg["ssd_fanout"])
                link.send(
                    {"metrics": drafter.batch_metrics() if ssd else [], "trace": drafter.trace if ssd else []}
                )
                break
            if msg["op"] == "start":
                gens = None
                if msg["states"] is not None:
                    gens = [torch.Generator(device=target.device) for _ in msg["states"]]
                    for g, state in zip(gens, msg["states"], strict=True):
                        g.set_state(state)
                drafter.start(msg["prompts"], msg["params"], gens)
                link.send({"ok": True})
                continue
            if msg["accepted"] is not None:
                drafter.commit(msg["accepted"], None, fetched)
            if msg["ended"]:
                drafter.ended(msg["ended"])
            if msg["rows"] is not None:
                drafter.retain(msg["rows"])
                fetched = None if fetched is None else [fetched[r] for r in msg["rows"]]
            batch = drafter.propose(msg["contexts"], drafter.tree)
            fetched = None if batch.fetched is None else batch.fetched.tolist()
            drafts = [pack(d) for d in batch.to_drafts()]
            link.send({"drafts": drafts, "forwards": drafter.forwards})
            if cfg["ssd_fanout"]:  # while the target verifies; its verdict's arrival stops the branches
                size = torch.zeros(1, dtype=torch.long)
                sent, listener = time.perf_counter(), Listener(link, size)
                drafter.speculate(stop=listener.arrived.is_set if cfg["interrupt"] else None)
                listener.join()
                for row in drafter.rows:  # the target's verification + the round trip, as seen from here
                    row.record["window_s"] = listener.at - sent
    link.close()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
