"""Pushing an exported folder to the Hugging Face Hub (huggingface_hub's HfApi).

    push_folder("exports/eagle3", "me/smollm2-eagle3", private=True, revision="v1")

The repository is created if needed (`exist_ok`), the branch too when `revision` names one; the upload
is one commit. Without a token or network the push fails with one line saying how to log in; the export
on disk stays as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

from draftsmith.runtime.errors import BadInputError, DraftsmithError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def check_repo_id(repo_id: str) -> None:
    if not REPO_ID.fullmatch(repo_id) or ".." in repo_id or len(repo_id) > 96:
        raise BadInputError("--push-to-hub", repo_id, "a Hub repository id like user/name")


def push_folder(folder: Path, repo_id: str, private: bool = False, revision: str | None = None) -> str:
    """Upload `folder` as one commit -> the commit's URL."""
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            revision=revision,
            commit_message=f"draftsmith export ({Path(folder).name})",
        )
    except Exception as err:  # no token, no network, no permission: one line, not a trace
        first = str(err).splitlines()[0] if str(err) else ""
        raise DraftsmithError(
            f"push to {repo_id} failed ({type(err).__name__}: {first}); the export is intact in {folder}. "
            "Log in with `hf auth login` or set HF_TOKEN, then rerun with --push-to-hub"
        ) from None
    return getattr(commit, "commit_url", None) or f"https://huggingface.co/{repo_id}"
