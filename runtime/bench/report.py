"""What `draftsmith bench` writes: results.json, meta.json, report.md and PNG plots.

    write_report(Path("runs/bench"), rows, meta)    # -> {"rows", "meta", "files"}

results.json is the list of rows (docs/architecture.md, section 5.4); meta.json holds what makes the run
reproducible (command, versions, machine, seeds, request) plus skipped methods, per-category rows and the
roofline. report.md puts them in one page. Plots (matplotlib, Agg): speedup vs batch size per method,
acceptance per draft position, the distribution of accepted lengths per cycle, and for drafts with
survival estimates their reliability (runtime/bench/calibration_report.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftsmith.runtime.bench.calibration_report import calibration_table
from draftsmith.runtime.bench.cycle_fields import ssd_table
from draftsmith.runtime.core.config import atomic_write_text

log = logging.getLogger("draftsmith")


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[dict]) -> str:
    """Markdown: one line per row."""
    lines = [
        "| method | T | batch | tok/s | speedup | tau | efficiency | acceptance per position "
        "| draft ms/cycle | verify ms/cycle | draft share | TTFT ms | TPOT ms | greedy identical |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        accept = (
            "-"
            if not r.get("accept_rate_per_position")
            else str([round(a, 2) for a in r["accept_rate_per_position"]])
        )
        depth = f" depth shares {r['depth_share']}" if r.get("depth_share") else ""
        same = r.get("greedy_identical", "n/a (sampling)")
        if same is False:
            n = f"{len(r['greedy_mismatches'])}{'+' if len(r['greedy_mismatches']) == 10 else ''}"
            same = (
                f"near-ties only ({n} requests)"
                if r.get("greedy_near_ties_only")
                else f"**NO** ({n} mismatching requests)"
            )
        method = r["method"] + (f" [{r['weights']} weights]" if r.get("weights") else "")  # another engine's
        lines.append(
            f"| {method} | {r['temperature']:g} | {r['batch_size']} | {r['tokens_per_s']:.1f} "
            f"| {r['speedup_vs_plain']:.2f} | {_fmt(r.get('mean_accepted'))} | {_fmt(r.get('efficiency'))} "
            f"| {accept}{depth} | {_fmt(r.get('draft_ms_per_cycle'))} | {_fmt(r.get('verify_ms_per_cycle'))} "
            f"| {_fmt(r.get('draft_share_of_wall'), '.0%')} | {_fmt(r['ttft_ms']['median'], '.0f')} "
            f"| {_fmt(r['tpot_ms']['median'], '.1f')} | {same} |"
        )
    return "\n".join(lines)


def greedy_mark(row: dict) -> str:
    """'' identical (or sampling), '~' near-ties only, '!' a real greedy mismatch."""
    if row.get("greedy_identical") is not False:
        return ""
    return "~" if row.get("greedy_near_ties_only") else "!"


def speedup_matrix(rows: list[dict]) -> str:
    """Markdown: one line per method, speedup over plain per (temperature, batch size), plus tau and
    acceptance per position at the smallest batch; a greedy mismatch is marked with a `!`, differences
    that are all near-ties of the target's logits (bf16/GPU numerics, runtime/verify/near_tie.py) with a
    `~`."""
    cols = sorted({(r["temperature"], r["batch_size"]) for r in rows})
    small = min(b for _, b in cols)
    head = " | ".join(f"T={t:g} b={b}" for t, b in cols)
    lines = [f"| method | {head} | tau (b={small}) | acceptance per position (b={small}) |"]
    lines.append("|---|" + "---:|" * len(cols) + "---|---|")
    for name in dict.fromkeys(r["method"] for r in rows):
        mine = {(r["temperature"], r["batch_size"]): r for r in rows if r["method"] == name}
        cells = []
        for col in cols:
            r = mine.get(col)
            cells.append("-" if r is None else f"{r['speedup_vs_plain']:.2f}{greedy_mark(r)}")
        taus = [
            f"{mine[c]['mean_accepted']:.2f}"
            for c in cols
            if c in mine and c[1] == small and mine[c].get("mean_accepted")
        ]
        accept = [str([round(a, 2) for a in mine[c]["accept_rate_per_position"]]) for c in cols
                  if c in mine and c[1] == small and mine[c].get("accept_rate_per_position")]  # fmt: skip
        lines.append(
            f"| {name} | {' | '.join(cells)} | {' / '.join(taus) or '-'} | {' / '.join(accept) or '-'} |"
        )
    return "\n".join(lines)


def roofline_table(roof: dict, rows: list[dict]) -> str:
    m = roof["machine"]
    lines = [
        f"Machine: copy bandwidth {m['bandwidth_gb_s']} GB/s, matmul {m['matmul_tflops']} TFLOP/s "
        f"({m['matmul_dtype']}), measured {m['measured']} (cached per machine). "
        f"Mean context {roof['context']} tokens.",
        "",
        "| batch | bytes per step (MB) | memory-bound ceiling tok/s | compute-bound tok/s | bound "
        "| plain tok/s (share of ceiling) | best method tok/s (share) |",
        "|---:|---:|---:|---:|---|---|---|",
    ]
    for line in roof["lines"]:
        b = line["batch_size"]
        at_b = [r for r in rows if r["batch_size"] == b and r["temperature"] == 0] or [
            r for r in rows if r["batch_size"] == b
        ]
        plain = next((r for r in at_b if r["method"] == "plain"), None)
        best = max(at_b, key=lambda r: r["tokens_per_s"], default=None)
        ceil = line["ceiling_tokens_per_s"]

        def share(r, ceil=ceil):
            return "-" if r is None else f"{r['tokens_per_s']:.1f} ({r['tokens_per_s'] / ceil:.0%})"

        best_name = "" if best is None else f"{best['method']}: "
        lines.append(
            f"| {b} | {line['bytes_per_step'] / 1e6:.1f} | {line['memory_bound_tokens_per_s']:.1f} "
            f"| {line['compute_bound_tokens_per_s']:.1f} | {line['bound']} | {share(plain)} "
            f"| {best_name}{share(best)} |"
        )
    return "\n".join(lines)


def report_markdown(rows: list[dict], meta: dict, plots: list[str]) -> str:
    req = meta["request"]
    parts = [
        "# draftsmith bench",
        "",
        f"- command: `{meta['command'] or 'run_bench(...)'}`",
        f"- date: {meta['date']}; target: {meta['target']}; prompts: {req['prompts']} "
        f"({req['num_prompts']} asked; mean first-turn prompt {meta['prompt_tokens_mean']:.0f} tokens); "
        f"max new tokens {req['max_new_tokens']}; repeats {req['repeats']} (median); seed {req['seed']}",
        f"- machine: {json.dumps(meta['machine'])}",
        f"- versions: {json.dumps(meta['versions'])}",
        "- fairness: warm-up per method and batch size, methods interleaved per batch in rotating order, "
        "speedup = tokens/s over plain decoding's in the same run",
        "",
    ]

    def named(mark: str) -> list[str]:
        return [f"{r['method']} (T={r['temperature']:g}, batch {r['batch_size']})" for r in rows
                if greedy_mark(r) == mark]  # fmt: skip

    if named("!"):
        parts += [
            f"**GREEDY MISMATCH**: {', '.join(named('!'))} differ from plain decoding at temperature 0.",
            "",
        ]
    if named("~"):
        parts += [
            f"Near-ties (runtime/verify/near_tie.py): {', '.join(named('~'))} differ from plain decoding only"
            " where the target's two top logits are within rounding (their gaps are in results.json).",
            "",
        ]
    parts += ["## Speedup over plain decoding", "", speedup_matrix(rows), ""]
    parts += ["## Results", "", format_table(rows), ""]
    parts += [
        "draft / verify ms per cycle: the mean over the row's batch cycles (one verify forward of the whole"
        " batch; runtime/bench/cycle_fields.py); draft share: drafting's share of the wall time.",
        "",
    ]
    ssd = ssd_table(rows)
    parts += ["## SSD (in process)", "", ssd, ""] if ssd else []
    calibration = calibration_table(rows)
    if calibration:
        parts += ["## Calibration of the survival estimates", "", calibration, "",
                  "ECE over 10 equal-width bins of the predicted survival; a node counts when its parent was "
                  "accepted (the conditional event the estimate predicts); lengths: drafted tokens accepted "
                  "per verified draft (runtime/bench/calibration_report.py).", ""]  # fmt: skip
    if meta.get("skipped"):
        parts += [
            "Not run: "
            + "; ".join(f"{s['method']} at batch {s['batch_size']}: {s['why']}" for s in meta["skipped"]),
            "",
        ]
    if meta.get("categories"):
        parts += [
            "## Per category (batch 1)",
            "",
            "| method | T | category | prompts | tok/s | speedup |",
            "|---|---:|---|---:|---:|---:|",
        ]
        parts += [
            f"| {c['method']} | {c['temperature']:g} | {c['category']} | {c['prompts']} "
            f"| {c['tokens_per_s']:.1f} | {c['speedup_vs_plain']:.2f} |"
            for c in meta["categories"]
        ]
        parts.append("")
    if meta.get("roofline"):
        parts += ["## Roofline", "", roofline_table(meta["roofline"], rows), ""]
    key = label_key(rows) if plots else None
    parts += [key, ""] if key else []
    parts += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(parts) + "\n"


def write_report(out: Path, rows: list[dict], meta: dict, plots: bool = True, final: bool = True) -> dict:
    """results.json and meta.json (atomically; also after every block), then report.md and plots."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(rows, indent=1))
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=1))
    if not final:
        return {"rows": rows, "meta": meta, "files": []}
    pngs = make_plots(out, rows) if plots else []
    atomic_write_text(out / "report.md", report_markdown(rows, meta, pngs))
    files = [str(out / n) for n in ("results.json", "meta.json", "report.md")] + pngs
    log.info("bench: wrote %s", ", ".join(files))
    return {"rows": rows, "meta": meta, "files": files}


def plot_labels(methods) -> dict[str, str]:
    """Legend labels: each method without the folder or model id its draft names (the report's tables and
    its "Plot labels" line carry the whole spec), e.g. `eagle3@chain:3`; drafts that would then read
    alike are numbered in order of appearance: `eagle3[1]@chain:3`, `eagle3[2]@chain:3`."""
    methods = list(dict.fromkeys(methods))
    short = {}  # whole draft -> (kind, option) for drafts that name a path
    for method in methods:
        draft = method.partition("@")[0]
        kind, _, arg = draft.partition(":")
        where, hash_, option = arg.partition("#")
        if "/" in where or "\\" in where:
            short[draft] = (kind, hash_ + option)
    names = {}
    for draft, (kind, option) in short.items():
        alike = [d for d, k in short.items() if k == (kind, option)]
        names[draft] = f"{kind}[{alike.index(draft) + 1}]{option}" if len(alike) > 1 else kind + option
    labels = {}
    for method in methods:
        draft, at, tree = method.partition("@")
        labels[method] = names.get(draft, draft) + at + tree
    return labels


def label_key(rows: list[dict]) -> str | None:
    """The report's line that maps shortened plot labels back to whole drafts (None if none is short)."""
    labels = plot_labels(r["method"] for r in rows)
    pairs = {label.partition("@")[0]: method.partition("@")[0] for method, label in labels.items()}
    pairs = {label: draft for label, draft in pairs.items() if label != draft}
    if not pairs:
        return None
    return "Plot labels: " + ", ".join(f"`{label}` = `{draft}`" for label, draft in pairs.items())


def make_plots(out: Path, rows: list[dict]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("bench: matplotlib is not installed; no plots (pip install matplotlib)")
        return []
    files = [_speedup_plot(plt, out, rows), _acceptance_plot(plt, out, rows), _lengths_plot(plt, out, rows)]
    files.append(_reliability_plot(out, rows))
    return [f for f in files if f]


def _reliability_plot(out: Path, rows: list[dict]) -> str | None:
    """The survival estimates' reliability per row that has them (every batch size: few nodes each), drawn
    as training draws a confidence head's."""
    from draftsmith.train.loop.metrics import reliability_plot

    labels = plot_labels(r["method"] for r in rows)
    series = [
        (f"{labels[r['method']]} T={r['temperature']:g} b={r['batch_size']} ECE {r['calibration_error']:.3f}",
         r["reliability"])
        for r in rows
        if r.get("reliability")
    ]  # fmt: skip
    return reliability_plot(out / "reliability.png", series)


def _speedup_plot(plt, out: Path, rows: list[dict]) -> str:
    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    labels = plot_labels(r["method"] for r in rows)
    for ax, temp in zip(axes[0], temps, strict=True):
        for name in dict.fromkeys(r["method"] for r in rows):
            pts = sorted(
                (r["batch_size"], r["speedup_vs_plain"])
                for r in rows
                if r["method"] == name and r["temperature"] == temp
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=labels[name])
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set(
            xscale="log", xlabel="batch size", ylabel="speedup over plain (tok/s ratio)", title=f"T={temp:g}"
        )
        sizes = sorted({r["batch_size"] for r in rows})
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    return _save(plt, fig, out / "speedup_vs_batch.png")


def _smallest_batch_plot(plt, rows: list[dict], key: str, draw, path: Path, **axes) -> str | None:
    """One figure over the rows at the smallest batch size that carry `key` (per-position plots compare
    drafters there): `draw(ax, series)` plots the [(row[key], label)], `axes` names the axes. None when no
    row carries `key`."""
    smallest = min(r["batch_size"] for r in rows)
    labels = plot_labels(r["method"] for r in rows)
    series = [
        (r[key], f"{labels[r['method']]} T={r['temperature']:g}")
        for r in rows
        if r.get(key) and r["batch_size"] == smallest
    ]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    draw(ax, series)
    ax.set(**axes)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def _acceptance_plot(plt, out: Path, rows: list[dict]) -> str | None:
    def draw(ax, series) -> None:
        from matplotlib.ticker import MaxNLocator

        for rates, label in series:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions are whole numbers

    axes = dict(
        xlabel="draft position", ylabel="P(accepted | drafted)", ylim=(0, 1), title="acceptance per position"
    )
    path = out / "acceptance_per_position.png"
    return _smallest_batch_plot(plt, rows, "accept_rate_per_position", draw, path, **axes)


def _lengths_plot(plt, out: Path, rows: list[dict]) -> str | None:
    def draw(ax, series) -> None:
        width = 0.8 / len(series)
        for i, (counts, label) in enumerate(series):
            total = sum(counts)
            offset = (i - (len(series) - 1) / 2) * width  # each length's bars centered on it
            ax.bar([n + offset for n in range(len(counts))], [c / total for c in counts], width, label=label)
        ax.set_xticks(range(max(len(counts) for counts, _ in series)))

    axes = dict(
        xlabel="drafted tokens accepted in a cycle", ylabel="share of cycles", title="accepted lengths"
    )
    path = out / "accepted_lengths.png"
    return _smallest_batch_plot(plt, rows, "accepted_length_counts", draw, path, **axes)


def _save(plt, fig, path: Path) -> str:
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return str(path)
