"""Aux-layer ids: the one place that states which target hidden states feature heads read, and how
engines number them (docs/architecture.md, section 5.6).

draftsmith ids are 0-based decoder-layer outputs: id i is the residual stream after decoder layer i,
transformers' `hidden_states[i + 1]`. SGLang, SpecForge and ModelOpt configs mean the same; vLLM,
speculators and the official EAGLE code count "the input to layer X" and write i + 1 for the same tensor
(`engine_layer_ids`). Default: (1, L//2 - 1, L - 4), the layers every anchor taps.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from draftsmith.runtime.errors import BadInputError

log = logging.getLogger(__name__)

AUX_LAYER_CONVENTION = (
    "0-based decoder-layer outputs: id i is the residual stream after decoder layer i (transformers "
    "hidden_states[i+1]). SGLang, SpecForge and ModelOpt config ids mean the same ('output of layer i'); "
    "vLLM, speculators and EAGLE official ids mean 'input to layer X' and name the same tensor i+1."
)


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's taps as 0-based layer outputs: after layers 1, L//2-1 and L-4."""
    return (1, num_layers // 2 - 1, num_layers - 4)


def parse_aux_layers(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """`auto`/None -> None (the default); "1,14,26" or a sequence -> ints. Syntax only, no range check."""
    if text is None or (isinstance(text, str) and text.strip().lower() == "auto"):
        return None
    if isinstance(text, str):
        try:
            return tuple(int(part) for part in text.split(","))
        except ValueError:
            raise BadInputError(
                "--aux-layers", text, "auto or comma-separated integers, e.g. 1,14,26"
            ) from None
    return tuple(int(i) for i in text)


def resolve_aux_layers(aux_layers, num_layers: int) -> tuple[int, ...]:
    """Validated layer ids: non-empty, in [0, L), strictly increasing. Not 3 of them: a warning.

    EAGLE-3 heads take exactly 3 (their fc input is 3*H); other heads may want other counts, so any
    non-empty list is accepted and recorded (wrong ids are an error, never a default: vLLM only warns)."""
    layers = parse_aux_layers(aux_layers)
    if layers is None:
        layers = default_aux_layers(num_layers)
        if not _valid_layers(layers, num_layers):
            raise BadInputError(
                "--aux-layers",
                "auto",
                f"explicit layer ids: the default (1, L//2-1, L-4) = {layers} is not valid for a "
                f"{num_layers}-layer target (it needs at least 7 layers)",
            )
        return layers
    if not layers:
        raise BadInputError("--aux-layers", "an empty list", "at least one layer id")
    if not all(0 <= i < num_layers for i in layers):
        raise BadInputError("--aux-layers", list(layers), f"0-based layer ids in [0, {num_layers})")
    if list(layers) != sorted(set(layers)):
        raise BadInputError("--aux-layers", list(layers), "distinct layer ids in increasing order")
    if len(layers) != 3:
        log.warning("capture: %d aux layers %s; EAGLE-3 heads take exactly 3", len(layers), list(layers))
    return layers


def _valid_layers(layers: tuple[int, ...], num_layers: int) -> bool:
    return all(0 <= i < num_layers for i in layers) and list(layers) == sorted(set(layers))


def engine_layer_ids(aux_layers: Sequence[int]) -> dict:
    """The same tensors named in both engine conventions (for export)."""
    return {
        "output_of_layer (SGLang, SpecForge, ModelOpt)": list(aux_layers),
        "input_to_layer (vLLM, speculators, EAGLE official)": [i + 1 for i in aux_layers],
    }


# What an id X written in a config means, per reader: "output" = the output of decoder layer X (our ids),
# "input" = the input to layer X (= the output of layer X - 1): docs/architecture.md, 5.6.
CONVENTIONS = {"output": 0, "input": 1}
ENGINE_CONVENTION = {
    "sglang": "output",
    "specforge": "output",
    "modelopt": "output",
    "vllm": "input",
    "speculators": "input",
    "eagle": "input",
}


def to_engine_ids(aux_layers: Sequence[int], engine: str) -> list[int]:
    """Our 0-based output ids -> the integers `engine` must read to tap the same tensors."""
    return [i + CONVENTIONS[_convention(engine)] for i in aux_layers]


def from_engine_ids(ids: Sequence[int], convention: str) -> list[int]:
    """Ids written in `convention` ('output', 'input', an engine name, or 'auto') -> our output ids.

    'auto' follows SGLang's rule for published drafts (sglang PR #25454): a list that starts at 1 is
    read as layer outputs (SpecForge / ModelOpt style), anything else as layer inputs (vLLM / EAGLE);
    one that starts at 0 can only be outputs (the input to layer 0 is the embedding, which no head taps)."""
    ids = [int(i) for i in ids]
    if convention == "auto":
        convention = "output" if ids and ids[0] <= 1 else "input"
        log.info(
            "aux layer ids %s read as %s-of-layer ids (the SGLang rule; override with #ids=)", ids, convention
        )
    return [i - CONVENTIONS[_convention(convention)] for i in ids]


def _convention(name: str) -> str:
    name = ENGINE_CONVENTION.get(name, name)
    if name not in CONVENTIONS:
        choices = sorted(CONVENTIONS) + sorted(ENGINE_CONVENTION)
        raise BadInputError("aux id convention", name, f"one of {', '.join(choices)}")
    return name
