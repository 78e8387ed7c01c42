"""What `draftsmith eval` writes: eval.json (the whole result), report.md and PNG plots.

    result = write_eval_report(Path("runs/eval"), result)   # -> result with "files"

report.md: the pinned harness, the leaderboard per temperature (drafts ranked by mean acceptance length
pooled over the sets), then per set the record of each draft and its categories. Plots (matplotlib,
Agg): acceptance per draft position, the accepted-length histogram, mean acceptance length per category.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftsmith.runtime.bench.eval_context_report import context_markdown, context_plot
from draftsmith.runtime.core.config import atomic_write_text

log = logging.getLogger("draftsmith")


def leaderboard(entries: list[dict]) -> dict[str, list[dict]]:
    """temperature -> the methods ranked by mean acceptance length pooled over every set (ties: the
    higher draft acceptance rate first)."""
    from draftsmith.runtime.bench.eval_record import pool_records

    board: dict[str, list[dict]] = {}
    for temperature in sorted({e["temperature"] for e in entries}):
        at = [e for e in entries if e["temperature"] == temperature]
        rows = []
        for method in dict.fromkeys(e["method"] for e in at):
            mine = [e for e in at if e["method"] == method]
            rows.append({"method": method, "K": mine[0]["K"], **pool_records(mine)})
        rows.sort(key=lambda r: (-(r["mean_acceptance_length"] or 0), -(r["draft_acceptance_rate"] or 0)))
        board[f"{temperature:g}"] = [{"rank": i + 1, **r} for i, r in enumerate(rows)]
    return board


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def record_cells(r: dict) -> str:
    per = [round(a, 2) for a in r["accept_rate_per_position"]]
    return (
        f"{_fmt(r['mean_acceptance_length'])} | {_fmt(r['draft_acceptance_rate'])} | {per} "
        f"| {r['accepted_length_counts']} | {r['steps']} | {r['new_tokens']}"
    )


RECORD_HEAD = "mean acceptance length | draft acceptance rate | per position | histogram | steps | tokens"


def markdown(result: dict, plots: list[str]) -> str:
    h = result["harness"]
    t = h["target"]
    lines = [
        "# draftsmith eval",
        "",
        f"Command: `{result['command'] or '(library call)'}`",
        "",
        f"Harness `{h['id']}`: target {t['name']} (config {t['config_hash']}, chat template "
        f"{t['chat_template_hash']}, {t['dtype']} on {t['device']}), temperatures {h['temperatures']}, "
        f"sampling {h['sampling']}, "
        f"{h['max_new_tokens']} new tokens, chat {h['chat']}, {h['turns']}.",
        "",
        "| set | source | config | split | revision | prompts | file sha256 | rows hash | prompts hash |",
        "|---|---|---|---|---|---:|---|---|---|",
    ]
    for s in h["sets"]:
        sha = (s.get("file_sha256") or "-")[:16]
        lines.append(
            f"| {s['set']} | {s.get('source')} | {s.get('config') or '-'} | {s.get('split', '-')} "
            f"| {s.get('revision') or '-'} | {s['prompts']} | {sha} | {s.get('rows_hash', '-')} "
            f"| {s['prompts_hash']} |"
        )
    for temperature, rows in result["leaderboard"].items():
        lines += ["", f"## Leaderboard, T = {temperature}", "", f"| rank | draft | K | {RECORD_HEAD} |"]
        lines.append("|---:|---|---:|---:|---:|---|---|---:|---:|")
        lines += [f"| {r['rank']} | {r['method']} | {r['K']} | {record_cells(r)} |" for r in rows]
    lines += ["", "## Per set and category", "", f"| draft | T | set | category | {RECORD_HEAD} |"]
    lines.append("|---|---:|---|---|---:|---:|---|---|---:|---:|")
    for e in result["entries"]:
        lines.append(
            f"| {e['method']} | {e['temperature']:g} | {e['set']} | **all** | {record_cells(e['overall'])} |"
        )
        for category, r in e["categories"].items():
            lines.append(
                f"| {e['method']} | {e['temperature']:g} | {e['set']} | {category} | {record_cells(r)} |"
            )
    if "context" in result:  # acceptance against context length (runtime/bench/eval_context_report.py)
        lines += context_markdown(result)
    lines += ["", *[f"![{Path(p).stem}]({Path(p).name})" for p in plots]]
    return "\n".join(lines) + "\n"


def write_eval_report(out: Path, result: dict, plots: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    files = make_plots(out, result) if plots else []
    if plots and "context" in result:
        files.append(context_plot(out, result))
    result["files"] = [str(out / "eval.json"), str(out / "report.md"), *files]
    atomic_write_text(out / "eval.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "report.md", markdown(result, files))
    log.info("eval: wrote %s", ", ".join(result["files"]))
    return result


def make_plots(out: Path, result: dict) -> list[str]:
    """One figure per kind, a panel per temperature, a series per draft (its sets pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    board = result["leaderboard"]
    files = []
    for name, draw, ylabel in (
        ("acceptance_per_position", _positions, "P(accepted | drafted)"),
        ("accepted_lengths", _histogram, "share of steps"),
        ("acceptance_length_by_category", _categories(result["entries"]), "mean acceptance length"),
    ):
        fig, axes = plt.subplots(1, len(board), figsize=(6 * len(board), 4), squeeze=False)
        for ax, (temperature, rows) in zip(axes[0], board.items(), strict=True):
            draw(ax, rows, temperature)
            ax.set_title(f"{name.replace('_', ' ')}, T = {temperature}")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(str(path))
    return files


def _positions(ax, rows, _temperature) -> None:
    for r in rows:
        rates = r["accept_rate_per_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=r["method"])
    ax.set_xlabel("draft position")
    ax.set_ylim(0, 1)


def _histogram(ax, rows, _temperature) -> None:
    width = 0.8 / max(len(rows), 1)
    for i, r in enumerate(rows):
        counts = r["accepted_length_counts"]
        total = max(sum(counts), 1)
        offset = (i - (len(rows) - 1) / 2) * width  # each length's bars centered on it
        ax.bar(
            [n + offset for n in range(len(counts))], [c / total for c in counts], width, label=r["method"]
        )
    ax.set_xlabel("drafted tokens accepted in a step")


def _categories(entries: list[dict]):
    def draw(ax, rows, temperature) -> None:
        at = [e for e in entries if f"{e['temperature']:g}" == temperature]
        cats = list(dict.fromkeys(f"{e['set']}/{c}" for e in at for c in e["categories"]))
        width = 0.8 / max(len(rows), 1)
        for i, r in enumerate(rows):
            mine = [e for e in at if e["method"] == r["method"]]
            values = {
                f"{e['set']}/{c}": v["mean_acceptance_length"] or 0
                for e in mine
                for c, v in e["categories"].items()
            }
            offset = (i - (len(rows) - 1) / 2) * width
            ax.bar(
                [n + offset for n in range(len(cats))],
                [values.get(c, 0) for c in cats],
                width,
                label=r["method"],
            )
        ax.set_xticks(range(len(cats)), cats, rotation=45, ha="right", fontsize=7)

    return draw
