"""`draftsmith eval`'s leaderboard over heads of every layout the runtime reads, for one tiny target on one
pinned harness: EAGLE-3 in draftsmith's and in speculators' layout, P-EAGLE, MTP, Medusa, DFlash, beside
ngram. Random heads (tests/*_heads.py): the point is that each loads with its checks, decodes, and is
ranked with a record and a folder hash; a head saved twice in two layouts accepts the same at T = 0.

    python -m pytest tests/runtime/test_eval_leaderboard.py -q
"""

import json
from pathlib import Path

import pytest
from every_head import save_every_head

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eval_sets"


@pytest.fixture(scope="module")
def heads(tiny_dir, tmp_path_factory):
    """A head folder per layout for the tiny target (tests/every_head.py)."""
    tiny = Target.load(str(tiny_dir), device="cpu")
    return save_every_head(tiny, tiny_dir, tmp_path_factory.mktemp("heads"))


def test_heads_of_every_layout_ranked_on_one_harness(tiny_dir, heads, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    drafts = [
        f"eagle3:{heads / 'eagle3'}@chain:2",
        f"eagle3:{heads / 'eagle3-speculators'}@chain:2",
        f"peagle:{heads / 'peagle'}@chain:2",
        f"mtp:{heads / 'mtp'}@chain:1",
        f"medusa:{heads / 'medusa'}@chain:2",
        f"dflash:{heads / 'dflash'}@chain:2",
        "ngram@chain:2",
    ]
    out = tmp_path / "board"
    argv = ["eval", "--target", str(tiny_dir), "--set", f"gsm8k:{FIXTURES / 'gsm8k__main.jsonl'}"]
    argv += [a for d in drafts for a in ("--draft", d)]
    assert main([*argv, "--max-new-tokens", "10", "--out", str(out), "--no-plots"]) == 0
    got = json.loads((out / "eval.json").read_text())
    board = got["leaderboard"]["0"]
    assert sorted(r["method"] for r in board) == sorted(drafts) and [r["rank"] for r in board] == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
    ]
    lengths = [r["mean_acceptance_length"] for r in board]
    assert lengths == sorted(lengths, reverse=True) and all(r["steps"] > 0 for r in board)
    folders = {e["method"]: e["draft"] for e in got["entries"]}
    assert (
        all("folder_hash" in folders[d] for d in drafts[:-1])
        and "folder_hash" not in folders["ngram@chain:2"]
    )
    same = {e["method"]: [p["accepted_lengths"] for p in e["prompts"]] for e in got["entries"]}
    assert same[drafts[0]] == same[drafts[1]]  # one head, two layouts: the same acceptance
    assert any(any(lengths) for lengths in same[drafts[0]])  # and it accepts some: not all-zero on both
    assert "## Leaderboard, T = 0" in (out / "report.md").read_text()
