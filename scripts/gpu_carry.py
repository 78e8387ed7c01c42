"""Carry the embedded target and the trained EAGLE-3 head to a lent GPU machine, in two calls.

A device call carries at most 64 MiB with the working tree, and the GPU machine has no network: the
embedded target's GGUF (98 MB) and the recipe's head (39 MB in float32) do not fit one call. So:

    python scripts/gpu_carry.py prepare        # here: .gpu_carry/a (first part of the GGUF) and
                                               # .gpu_carry/b (the rest, the head in bf16, the gguf wheel)
    run(command="true", carry=[".gpu_carry/a"], timeout_s=60)          # starts the machine, leaves part a
    run(command="bash scripts/gpu_check.sh", carry=[".gpu_carry/b", ".whl"], timeout_s=540)  # at once:
                                               # a warm machine keeps part a (it stays warm about 30 s)
    python3 scripts/gpu_carry.py join --to /tmp/carry   # there (gpu_check.sh does it): the GGUF, sha256
                                               # checked -> prints its path

`join` uses only the standard library. Without both parts gpu_check.sh measures a random-weight model of
the target's shape instead (no end-to-end rows with the head).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(".gpu_carry")
CALL_LIMIT = 64 * 2**20
FIRST_PART = 58 * 2**20  # leaves room for the working tree (~3 MB) in the first call


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def prepare(head: Path) -> None:
    from safetensors.torch import load_file, save_file

    from draftsmith.runtime.core.targets import ALIASES, embedded_gguf_path

    gguf = embedded_gguf_path(ALIASES["smollm2-135m"])
    shutil.rmtree(ROOT, ignore_errors=True)
    (ROOT / "a").mkdir(parents=True)
    (ROOT / "b" / "head").mkdir(parents=True)
    data = gguf.read_bytes()
    (ROOT / "a" / "target.part").write_bytes(data[:FIRST_PART])
    (ROOT / "b" / "target.part").write_bytes(data[FIRST_PART:])
    tensors = load_file(str(head / "model.safetensors"))
    half = {k: v.bfloat16() if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(half, str(ROOT / "b" / "head" / "model.safetensors"))
    shutil.copy(head / "config.json", ROOT / "b" / "head" / "config.json")
    import gguf as gguf_package  # the GPU machine lacks it; transformers reads GGUF through it

    version = gguf_package.__version__ if hasattr(gguf_package, "__version__") else _installed("gguf")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"gguf=={version}",
         "-d", str(ROOT / "b" / "whl")],
        check=True,
    )  # fmt: skip
    manifest = {"name": gguf.name, "sha256": sha256(gguf), "bytes": len(data), "head": str(head)}
    (ROOT / "b" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for part in ("a", "b"):
        size = sum(f.stat().st_size for f in (ROOT / part).rglob("*") if f.is_file())
        print(f"{ROOT / part}: {size / 2**20:.1f} MiB")
        if size > CALL_LIMIT - 4 * 2**20:
            raise SystemExit(f"{ROOT / part} is too large for one call with the working tree")


def _installed(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def join(to: Path) -> Path:
    manifest = json.loads((ROOT / "b" / "manifest.json").read_text())
    to.mkdir(parents=True, exist_ok=True)
    out = to / manifest["name"]
    with out.open("wb") as f:
        for part in ("a", "b"):
            f.write((ROOT / part / "target.part").read_bytes())
    if sha256(out) != manifest["sha256"]:
        out.unlink()
        raise SystemExit(f"{out}: sha256 differs from the manifest (a part is missing or stale)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="split the GGUF and write the head in bf16 under .gpu_carry/")
    p.add_argument("--head", type=Path, default=Path("runs/eagle3-smollm2-135m/final"))
    j = sub.add_parser("join", help="rebuild the GGUF from both parts (sha256 checked); print its path")
    j.add_argument("--to", type=Path, default=Path("/tmp/carry"))
    args = parser.parse_args()
    if args.verb == "prepare":
        prepare(args.head)
    else:
        print(join(args.to))


if __name__ == "__main__":
    main()
