"""`draftsmith eval`'s leaderboard over heads of every layout the runtime reads, for one tiny target on one
pinned harness: EAGLE-3 in draftsmith's and in speculators' layout, P-EAGLE, MTP, Medusa, DFlash, beside
ngram. Random heads (tests/*_heads.py): the point is that each loads with its checks, decodes, and is
ranked with a record and a folder hash; a head saved twice in two layouts accepts the same at T = 0.

    python -m pytest tests/runtime/test_eval_leaderboard.py -q
"""

import json
from pathlib import Path

import pytest
import torch
from dflash_heads import random_head as random_dflash
from medusa_heads import random_heads as random_medusa
from peagle_heads import AUX
from peagle_heads import random_head as random_peagle
from safetensors.torch import save_file

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.eagle3 import save_head as save_eagle3
from draftsmith.runtime.heads.layouts import to_speculators
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.heads.mtp import save_head as save_mtp
from draftsmith.runtime.heads.peagle import save_head as save_peagle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eval_sets"


@pytest.fixture(scope="module")
def heads(tiny_dir, tmp_path_factory):
    """kind -> a head folder for the tiny target."""
    tiny = Target.load(str(tiny_dir), device="cpu")
    root = tmp_path_factory.mktemp("heads")
    torch.manual_seed(1)
    eagle3 = Eagle3Head(Eagle3Config.for_target(tiny, aux_layer_ids=AUX))
    save_eagle3(eagle3, root / "eagle3")
    config, tensors = to_speculators(eagle3, verifier=str(tiny_dir))
    (root / "eagle3-speculators").mkdir()
    (root / "eagle3-speculators" / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(root / "eagle3-speculators" / "model.safetensors"), {"format": "pt"})
    save_peagle(random_peagle(tiny, block_size=3), root / "peagle")
    torch.manual_seed(2)
    save_mtp(MtpHead(MtpConfig.for_target(tiny, num_modules=1)), root / "mtp")
    random_medusa(tiny, heads=2).save_pretrained(root / "medusa")
    random_dflash(tiny, block=4).save_pretrained(root / "dflash")
    return root


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
