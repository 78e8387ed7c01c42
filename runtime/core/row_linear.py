"""Faster fp32 linears for the few rows of a CPU decode step: `(W @ x^T)^T` where it measures faster.

A decode step multiplies 1 row per sequence, a chain verification 2-9 rows, by every weight. On the AMD EPYC
machines of this project (torch 2.13.0+cpu, 2 threads) `F.linear` runs those shapes far below the memory
bandwidth: for 2-16 rows it takes a GEMM path that costs about 2-3x its own 1-row GEMV, and its 1-row GEMV
over the 49152 x 576 LM head streams 16 GB/s. The same product written as `W @ x^T` (a GEMM whose N is
the row count; one row is padded to two) streams about 3x faster there: a whole plain step falls from
38 to 23 ms and a 3-token verification from 81 to 35 ms (BENCHMARKS.md, issue 27). Which form wins depends
on the CPU and its BLAS, so nothing is assumed: `tune_rows_plan` times the target's whole forward both ways
at each row count (interleaved, median of repeats) and the plan keeps the rows where `W @ x^T` was faster;
every other row count, every non-fp32 tensor and every GPU stays on `F.linear`. Both forms are fp32 sums
over the same products in another order, so tokens differ from `F.linear`'s only where logits nearly tie
(judged by runtime/verify/near_tie.py, as the bench does for any kernel change).

    plan = tune_rows_plan(target)            # {rows, ...}: measured here, cached per machine and target
    use_rows_linear(target.model, plan)      # every nn.Linear under it, weights and state_dict unchanged
    use_rows_linear(target.model, set())     # back to F.linear everywhere

`generate`, `bench` and `demo` take `--cpu-linears auto|torch` (auto: tune once, then cached).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")
MODES = ("auto", "torch")
MAX_ROWS = 16  # beyond this many rows a GEMM is efficient either way
WIN = 0.9  # W @ x^T is planned where it takes at most 0.9x F.linear's time: a near tie is timing noise
# (an Intel Xeon plan chose W @ x^T for 3 rows on a 1.00x tie and its verifications then ran 2x slower)
CACHE_DIR = Path("~/.cache/draftsmith/machine").expanduser()


class RowsLinear(nn.Linear):
    """An nn.Linear (same parameters, same state_dict) computing `W @ x^T` for the row counts in its plan."""

    rows_plan: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if x.dim() else 0
        if rows not in self.rows_plan or x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)  # [rows, in]
        if rows == 1:  # BLAS runs N = 1 as the slow GEMV: a duplicated row makes it a GEMM
            flat = torch.cat([flat, flat])
        out = torch.mm(self.weight, flat.t()).t()[:rows].contiguous()  # [out, in] @ [in, rows] -> [rows, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def use_rows_linear(root: nn.Module, plan: set[int] | frozenset[int]) -> int:
    """Give every nn.Linear under `root` the plan (an empty plan: plain F.linear); returns how many."""
    count, plan = 0, frozenset(int(r) for r in plan)
    for module in root.modules():
        if type(module) in (
            nn.Linear,
            RowsLinear,
        ):  # quantized linears (runtime/core/quantize.py) keep theirs
            module.__class__ = RowsLinear
            module.rows_plan = plan
            count += 1
    return count


def drafter_roots(drafter, target) -> list[nn.Module]:
    """The modules a drafter holds besides the target's (a head, a draft model): they take the target's plan
    too, their linears having the target's widths."""
    from draftsmith.runtime.core.quantize import drafter_modules

    return drafter_modules(drafter, target) if drafter is not None else []


@contextlib.contextmanager
def torch_linears(*roots: nn.Module):
    """F.linear everywhere under `roots` inside the block (transformers' own rows in the bench, a
    `+torch-linears` row), then each linear's plan back."""
    saved = [(m, m.rows_plan) for root in roots for m in root.modules() if isinstance(m, RowsLinear)]
    for module, _ in saved:
        module.rows_plan = frozenset()
    try:
        yield
    finally:
        for module, plan in saved:
            module.rows_plan = plan


def check_mode(field: str, mode: str) -> str:
    if mode not in MODES:
        raise BadInputError(field, mode, f"one of {', '.join(MODES)}")
    return mode


def forward_costs(target, plan: frozenset[int], max_rows: int, repeats: int) -> list[float]:
    from draftsmith.runtime.verify.load_aware import measure_verify_costs

    use_rows_linear(target.model, plan)
    return measure_verify_costs(target, [1], max_nodes=max_rows, repeats=repeats).seconds[1]


def measure_rows_plan(target, max_rows: int = MAX_ROWS, rounds: int = 2, repeats: int = 2) -> dict:
    """Time the target's forward over 1..max_rows rows with F.linear and with `W @ x^T`, alternating the
    two `rounds` times; the plan holds the row counts where `W @ x^T`'s median was below WIN x F.linear's."""
    every = frozenset(range(1, max_rows + 1))
    torch_s, rows_s = [[] for _ in range(max_rows)], [[] for _ in range(max_rows)]
    for _ in range(rounds):
        for times, plan in ((torch_s, frozenset()), (rows_s, every)):
            for n, seconds in enumerate(forward_costs(target, plan, max_rows, repeats)):
                times[n].append(seconds)
    torch_ms = [round(1000 * statistics.median(t), 2) for t in torch_s]
    rows_ms = [round(1000 * statistics.median(t), 2) for t in rows_s]
    plan = sorted(n + 1 for n in range(max_rows) if rows_ms[n] < WIN * torch_ms[n])
    return {"plan": plan, "f_linear_ms": torch_ms, "w_xt_ms": rows_ms}


def cpu_model() -> str:
    """/proc/cpuinfo's model name ('AMD EPYC ...', 'Intel(R) Xeon(R) ...'): on Linux platform.processor()
    says only x86_64, and VMs on different CPUs can share a host name and a home folder."""
    info = Path("/proc/cpuinfo")
    text = info.read_text(errors="replace") if info.is_file() else ""
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def plan_key(target) -> str:
    """The machine and its CPU model, thread count, torch build and the target's weight shapes: what the
    timing depends on."""
    shapes = sorted({tuple(m.weight.shape) for m in target.model.modules() if isinstance(m, nn.Linear)})
    digest = hashlib.sha256(f"{shapes} {torch.__version__} {cpu_model()} win={WIN}".encode()).hexdigest()[:12]
    cpu = (platform.processor() or platform.machine()).replace(" ", "-")
    return f"rows-plan-{platform.node()}-{cpu}-t{torch.get_num_threads()}-{digest}"


def tune_rows_plan(target, cache: bool = True, max_rows: int = MAX_ROWS) -> frozenset[int]:
    """The measured plan for an fp32 CPU target (read from the machine cache when there), applied to it;
    an empty plan for other devices and dtypes."""
    if target.device.type != "cpu" or target.dtype != torch.float32:
        return frozenset()
    if not any(type(m) in (nn.Linear, RowsLinear) for m in target.model.modules()):
        return frozenset()  # every linear quantized (runtime/core/quantize.py): nothing to time
    path = CACHE_DIR / f"{plan_key(target)}.json"
    if cache and path.is_file():
        try:
            record = json.loads(path.read_text())
        except ValueError:
            record = None  # a damaged cache entry is measured again
        if record and record.get("max_rows") == max_rows:
            plan = frozenset(record["plan"])
            use_rows_linear(target.model, plan)
            return plan
    log.info("cpu linears: timing the target's forward with F.linear and W @ x^T at 1..%d rows", max_rows)
    t0 = time.perf_counter()
    record = measure_rows_plan(target, max_rows)
    record.update(max_rows=max_rows, measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    log.info(
        "cpu linears: W @ x^T for rows %s (%.1f s); 1 row %.1f -> %.1f ms",
        record["plan"],
        time.perf_counter() - t0,
        record["f_linear_ms"][0],
        record["w_xt_ms"][0],
    )
    if cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)  # atomic: a reader never sees half a file
    plan = frozenset(record["plan"])
    use_rows_linear(target.model, plan)
    return plan
