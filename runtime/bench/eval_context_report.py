"""The acceptance-vs-context-length part of `draftsmith eval`'s report (runtime/bench/eval_context.py).

    path = context_plot(Path("runs/eval"), result)   # acceptance_vs_context.png
    lines = context_markdown(result)                 # the report's "Acceptance against context" table

The plot has a row per temperature: mean acceptance length against context length (a line per draft) and
per-position acceptance against context length (a line per draft and position), each head's recorded
training length (its recipe's data.max_length) drawn as a dashed vertical line.
"""

from __future__ import annotations

from pathlib import Path


def context_markdown(result: dict) -> list[str]:
    c = result["context"]
    docs = c["docs"]
    lines = [
        "",
        "## Acceptance against context length",
        "",
        f"Documents: {docs['docs']} ({docs.get('source')}), cut to each length minus "
        f'{result["harness"]["max_new_tokens"]} new tokens, then: "{c["question"]}". Target context: '
        f"{c['target_context']} tokens.",
        "",
        "| draft | trained at (data.max_length) | from |",
        "|---|---:|---|",
    ]
    lines += [f"| {spec} | {t['max_length']} | {t['source'] or '-'} |" for spec, t in c["training"].items()]
    lines += [
        "",
        "| draft | T | context | prompt tokens | mean acceptance length | draft acceptance rate "
        "| per position |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in c["rows"]:
        per = [round(a, 2) for a in r["accept_rate_per_position"]]
        lines.append(
            f"| {r['method']} | {r['temperature']:g} | {r['context_length']} | {r['mean_prompt_tokens']} "
            f"| {_fmt(r['mean_acceptance_length'])} | {_fmt(r['draft_acceptance_rate'])} | {per} |"
        )
    return lines


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def context_plot(out: Path, result: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result["context"]
    temperatures = list(dict.fromkeys(r["temperature"] for r in c["rows"]))
    fig, axes = plt.subplots(len(temperatures), 2, figsize=(12, 4 * len(temperatures)), squeeze=False)
    for (left, right), temperature in zip(axes, temperatures, strict=True):
        rows = [r for r in c["rows"] if r["temperature"] == temperature]
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["context_length"])
            x = [r["context_length"] for r in mine]
            left.plot(x, [r["mean_acceptance_length"] or 1 for r in mine], marker="o", label=method)
            depth = max(len(r["accept_rate_per_position"]) for r in mine)
            for k in range(depth):
                rates = [_at(r["accept_rate_per_position"], k) for r in mine]
                right.plot(x, rates, marker=".", label=f"{method} #{k + 1}")
        for ax, ylabel in ((left, "mean acceptance length"), (right, "P(k-th accepted | drafted)")):
            _trained_lines(ax, c["training"])
            ax.set_xscale("log", base=2)
            ticks = sorted({*c["lengths"], *_known(c["training"])})
            ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=7)
            ax.minorticks_off()
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel}, T = {temperature:g}")
            ax.legend(fontsize=7)
        left.set_ylim(bottom=1)  # 1: no draft token accepted
        right.set_ylim(0, 1)
    fig.tight_layout()
    path = out / "acceptance_vs_context.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _at(rates: list[float], k: int) -> float | None:
    return rates[k] if k < len(rates) else None


def _known(training: dict) -> dict[int, list[str]]:
    """Known training length -> the drafts trained at it."""
    known: dict[int, list[str]] = {}
    for spec, t in training.items():
        if isinstance(t["max_length"], int):
            known.setdefault(t["max_length"], []).append(spec.partition("@")[0])
    return known


def _trained_lines(ax, training: dict) -> None:
    """A dashed vertical line at each known training length (heads trained at one length share it)."""
    for length, specs in _known(training).items():
        ax.axvline(length, linestyle="--", color="gray", label=f"trained at {length}: {', '.join(specs)}")
