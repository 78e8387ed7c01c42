"""The first SGLang release whose EAGLE-3 loader reads each EAGLE-3.1 option, and the check an SGLang export
makes against the release the user names (`draftsmith export --format eagle3 --sglang-version X`).

    needed = sglang_minimum(head.config)          # "0.5.17" for norm_before_fc, None for a plain head
    check_sglang_version(head.config, "0.5.12")   # BadInputError naming the minimum where X is older

SGLang's `LlamaForCausalLMEagle3.load_weights` (python/sglang/srt/models/llama_eagle3.py) skips a tensor it
has no parameter for, and its config reads a flag it does not know as nothing: an older SGLang serves an
EAGLE-3.1 head without its norms, silently, at lower acceptance. Read in the released wheels' llama_eagle3.py
(`pip download sglang==V --no-deps`): 0.5.11 has none of the three; 0.5.12 builds `fc_norm.{i}` (per aux
state, before `fc`) and reads `norm_output` (the normed state fed to the next step); 0.5.16 still has no
`input_norm`; 0.5.17 builds `input_norm` from `norm_before_fc` (one norm over the concatenation). So an
SGLang export of a head with any of them is refused unless `--sglang-version` names at least that release.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from draftsmith.runtime.errors import BadInputError

# EAGLE-3.1 option -> (the first SGLang release that reads it, the tensors or behaviour it adds)
SGLANG_READS = {
    "fc_norm": ("0.5.12", "fc_norm.{i}"),
    "norm_output": ("0.5.12", "the final-normed state fed to the next step"),
    "norm_before_fc": ("0.5.17", "input_norm"),
}


def sglang_options(config) -> list[str]:
    """The EAGLE-3.1 options an Eagle3Config sets, in SGLANG_READS's order."""
    return [name for name in SGLANG_READS if getattr(config, name)]


def sglang_minimum(config) -> str | None:
    """The oldest SGLang release that reads every EAGLE-3.1 option the head sets (None: a plain head)."""
    versions = [SGLANG_READS[name][0] for name in sglang_options(config)]
    return max(versions, key=Version) if versions else None


def parse(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        raise BadInputError("--sglang-version", version, "a release number such as 0.5.17") from None


def check_sglang_version(config, version: str | None) -> str | None:
    """-> the minimum SGLang release for this head; BadInputError when it sets an EAGLE-3.1 option and
    `version` is missing or older than the release that reads it."""
    needed = sglang_minimum(config)
    if version is not None:
        parse(version)
    if needed is None:
        return None
    options = sglang_options(config)
    if version is None or parse(version) < Version(needed):
        reads = "; ".join(f"{n} from {SGLANG_READS[n][0]} ({SGLANG_READS[n][1]})" for n in options)
        raise BadInputError(
            "--sglang-version",
            version,
            f">= {needed}: this head sets {', '.join(options)}; SGLang reads {reads}, older releases "
            "ignore it silently",
            "name the SGLang release that will serve it, or export --engine vllm / --format speculators",
        )
    return needed


def card_line(config) -> str:
    """The model card's line on which SGLang serves an SGLang export of this head."""
    needed = sglang_minimum(config)
    if needed is None:
        return "SGLang: no EAGLE-3.1 options; any release with LlamaForCausalLMEagle3 loads it"
    options = ", ".join(sglang_options(config))
    return (
        f"SGLang: needs >= {needed} (the first release that reads {options}; older ones skip them silently)"
    )
