"""A regenerated (or prepared) data folder's conversations as a JSONL training source: the self-distilled
recipe's second step (configs/eagle3-selfdistill-smollm2-135m.yaml).

    draftsmith data prepare --target smollm2-135m --source sharegpt --out data/sg --max-samples 3000 \\
        --max-length 512 --validation-fraction 0.02
    draftsmith data regenerate --target smollm2-135m --data data/sg --out data/sg-regen --max-new-tokens 512
    .venv/bin/python scripts/regenerated_to_jsonl.py data/sg-regen data/sg-regen.jsonl
    draftsmith train --config configs/eagle3-selfdistill-smollm2-135m.yaml

One line per conversation of both splits, {"id": row id, "messages": the conversation with the target's
answers}, in the folder's row order. A train run then prepares the file like any source; its split is a
hash of (data.seed, row id) (data_recipes/prepare.py `split_of`), so with the same seed and validation
fraction the regenerated conversations land in the same splits as the originals. A folder of parts (a
sharded regenerate) is read whole, as every later data step reads it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.data_recipes.parts import load_prepared, require_whole
from draftsmith.runtime.core.config import atomic_write_text


def conversations(folder: Path) -> list[dict]:
    require_whole(folder, "folder", ("prepare", "regenerate"))
    data = load_prepared(folder)
    return [
        {"id": row["id"], "messages": json.loads(row["messages"])} for split in data for row in data[split]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="a `draftsmith data regenerate` (or prepare) output folder")
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    args = parser.parse_args()
    rows = conversations(args.folder)
    atomic_write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} conversations -> {args.out}")


if __name__ == "__main__":
    main()
