"""The repository cites only what a clone has: no references to files outside it (the maintainers'
`../shared/` notes), and every relative markdown link in the user docs resolves to a file in the repo."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".txt", ".json", ".cfg"}
TEXT_NAMES = {"Makefile"}
# Paths into the maintainers' shared folder, and the names of the notes kept there (a bare
# "reliability.md A11" points there just the same). docs/ holds what users need of them.
OUTSIDE = ["../shared", "shared/research", "shared/design"]
OUTSIDE += [
    "ARCHITECTURE.md",
    "reliability.md",
    "mission_anchors",
    "ecosystem_cpu",
    "embedded_target_facts",
    "perf_anchors",
    "frontier_2026",
    "scale_review",
    "aesthetics.md",
]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def repo_files() -> list[str]:
    """Tracked files plus new ones git does not ignore (what a commit of this tree would hold)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return sorted({line for line in out.splitlines() if line and (ROOT / line).is_file()})


def text_files() -> list[str]:
    own = Path(__file__).resolve().relative_to(ROOT).as_posix()
    return [
        f
        for f in repo_files()
        if f != own and (Path(f).suffix in TEXT_SUFFIXES or Path(f).name in TEXT_NAMES)
    ]


def test_no_references_outside_the_repository():
    hits = []
    for name in text_files():
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            hits += [
                f"{name}:{number}: {pattern!r} in {line.strip()[:120]}"
                for pattern in OUTSIDE
                if pattern in line
            ]
    assert not hits, "references to files a clone does not have:\n" + "\n".join(hits)


def user_docs() -> list[str]:
    files = repo_files()
    return [f for f in files if f in ("README.md", "BENCHMARKS.md") or re.fullmatch(r"docs/[^/]+\.md", f)]


def test_user_docs_exist():
    docs = user_docs()
    assert {"README.md", "BENCHMARKS.md", "docs/architecture.md", "docs/embedded-target.md"} <= set(docs)


def test_relative_markdown_links_resolve():
    files = set(repo_files())
    broken = []
    for name in user_docs():
        text = FENCE.sub("", (ROOT / name).read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = target.split("#", 1)[0]
            resolved = (ROOT / name).parent.joinpath(path).resolve()
            try:
                relative = resolved.relative_to(ROOT).as_posix()
            except ValueError:
                broken.append(f"{name}: ({target}) leaves the repository")
                continue
            if relative not in files and not (
                resolved.is_dir() and any(f.startswith(relative + "/") for f in files)
            ):
                broken.append(f"{name}: ({target}) is not a file in the repository")
    assert not broken, "\n".join(broken)
