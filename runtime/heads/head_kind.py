"""What a head kind declares: the types of the registry in runtime/heads/head_kinds.py (which lists the
kinds).

    kind = HeadKind(name="eagle3", title="EAGLE-3 draft head", about="an EAGLE-3 head: ...",
                    module_class=lambda: Eagle3Head, section=Eagle3Section, read=load_eagle3,
                    spec="eagle3:DIR", layouts={"eagle3": Layout(...)},
                    vllm=VllmServe(layout="eagle3", method="eagle3"))

A kind is a trained head (EAGLE-3, MTP, ...). It declares:
- `name`: `head_type` in its folder's config.json, the `--draft NAME:DIR` prefix, `head.type` in a train
  config;
- `module` (`module_class()`, imported when asked): the nn.Module class, with
  `from_pretrained(folder, target=None)` (strict: names, shapes, finite values, and the target's
  identity when given) and `save_pretrained(folder)`;
- `section`: its `head:` section of a train config, a `HeadSection` subclass holding its own keys only
  (a `CotrainSection` for a kind that co-trains: its own co-training weight, `head.cotrain_weight`);
- `read(folder, target=None)`: the head in a folder of the kind, ours or an engine layout's (what
  `--draft NAME:DIR` loads; `load_draft` puts it on the target's device and dtype); `draft_arg(arg)`
  (optional) splits its drafter's options off `--draft NAME:ARG` (`mtp:DIR#recursive`,
  `dflash:DIR#block=N`); its drafter is registered on the drafters' side (runtime/drafters/registry.py),
  so heads never import drafters;
- `parse_tree(arg, spec)` (optional): `--tree SPEC` for `--draft NAME:ARG`, where a kind has trees of
  its own (Medusa's cartesian:K1,.. and sparse:N);
- `layouts`: export layout name -> `Layout` (writer, serve text; read back with the kind's `read`); every
  kind also has `draftsmith` (its own folder), added by `all_layouts`;
- `confidence`: whether the kind has a confidence head (its drafter fills `DraftBatch.survival`, which
  `adaptive:K,survival=confidence` and `bench`'s calibration read);
- `vllm` (optional): how vLLM serves it (`VllmServe`: the layout it loads, its `speculative_config`), read
  by `bench --baselines vllm-NAME:DIR` and the serve texts;
- `title`, `about` and the serve texts: the words its model card and `--draft`'s help use.
Its training objective is registered from train/ (train/objectives/registry.py), so this module and the
registry never import the trainer. What a layout's functions take and return is here too (`LayoutOptions`,
`Written`, `ServeArgs`); the helpers several kinds call are runtime/heads/kind_parts.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from draftsmith.runtime.core.artifacts import load_tensors, parameter_summary
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, WEIGHTS_FILE

DEFAULT_DEPTH = 2  # the default tree, chain:2, suits CPUs (BENCHMARKS.md); shallower for a shallower head


@dataclass
class HeadSection:
    """The keys every kind's `head:` section has; a kind's section subclasses it with its own keys (and
    `type` as a Literal of its name). Loading is strict: another kind's key is an error naming it."""

    type: str = ""  # a kind's section: a Literal of its name, defaulting to it
    aux_layers: str = "auto"  # target layers an offline capture stores: auto = (1, L/2-1, L-4), or ids
    draft_vocab_size: int = 8192  # the data steps' draft vocabulary (EAGLE-3: rows of its LM head)
    init_from_target: bool = True  # start the head's parts from the target's (each kind says which)

    def validate(self) -> HeadSection:
        self.check_at_least("draft_vocab_size", 1)
        return self

    def check_at_least(self, key: str, least: int) -> None:
        """`head.KEY` must be an integer >= `least`."""
        value = getattr(self, key)
        if value < least:
            raise BadInputError(f"head.{key}", value, f"an integer >= {least}")

    def keywords(self, *keys: str) -> dict:
        """These keys of the section as keywords of the head config's `for_target` (a kind's head_options:
        the trainer and the memory preflight build the same head)."""
        return {key: getattr(self, key) for key in keys}

    def check_run(self, cfg) -> None:
        """Checks against the rest of the train config (`cfg`); a kind adds its own."""


@dataclass
class CotrainSection(HeadSection):
    """The `head:` section of a kind whose target may train with it (`cotrain.enabled`, HeadKind.cotrain):
    its own weight of the draft loss in the co-trained loss, L_target + cotrain_weight * L_draft (each
    kind says which; train/objectives/cotrain.py trains the target)."""

    cotrain_weight: float = 0.3
    allows_self_distill: ClassVar[bool] = False  # cotrain.self_distill: built for Medusa-2 only (medusa2.py)

    def validate(self) -> CotrainSection:
        super().validate()
        if not self.cotrain_weight > 0:
            raise BadInputError("head.cotrain_weight", self.cotrain_weight, "a number > 0")
        return self

    def check_run(self, cfg) -> None:
        if cfg.cotrain.enabled and cfg.cotrain.self_distill and not self.allows_self_distill:
            raise BadInputError(
                "cotrain.self_distill", True, f"false for head.type={self.type} (it is Medusa-2's)"
            )


@dataclass
class LayoutOptions:
    """What an export layout may read besides the head (from `draftsmith export`'s flags)."""

    engine: str = "sglang"  # eagle3: whose aux-id convention (sglang or vllm)
    verifier: str | None = None  # speculators: the verifier path or Hub id written into the config
    target: str | None = None  # mtp: the target whose weights are appended (default: the head's own)
    speculative_tokens: int = 3  # drafted tokens per step in configs and serve commands
    any_target: bool = False  # a co-trained eagle3 head for a target other than its own (eagle3_binding)
    quantize: str | None = None  # fp8: the layout's weights in FP8 (runtime/heads/fp8_checkpoint.py)
    llamacpp: str = ".venv-llamacpp"  # gguf: the llama.cpp setup whose converter writes the file
    sglang_version: str | None = None  # eagle3 --engine sglang: the release serving it (sglang_versions.py)


@dataclass
class Written:
    """What a layout writer reports about the folder it wrote (the model card's facts)."""

    target: str  # the target's name (Hub id or path) the head was trained for
    config: dict  # the head's own config (the card's license guess reads its target)
    size: str  # "12.6M parameters, float32"
    details: list[str] = field(default_factory=list)  # layout-specific lines (aux ids, modules, ...)
    engine: str | None = None  # whose aux-id convention an eagle3 export wrote
    precision: str = ""  # a quantized export's weights, in the card's words ("" = as trained)

    @classmethod
    def of_head(cls, config, tensors: dict, details: list[str], **facts) -> Written:
        """What a writer of the head with `config` reports, its written `tensors` sized."""
        return cls(config.target, asdict(config), parameter_summary(tensors), details, **facts)


@dataclass
class ServeArgs:
    """What a layout's serve text names: where the export is, its target and kind, the draft budget."""

    repo: str  # the Hub id it is published under, or a placeholder path
    target: str
    kind: str
    engine: str | None = None
    speculative_tokens: int = 3
    formats: tuple[str, ...] = ()  # the kind's engine layouts (for the draftsmith layout's text)

    @property
    def generate(self) -> str:
        """The draftsmith command that serves this head, as a fenced block."""
        command = (
            f'draftsmith generate --target {self.target} --draft {self.kind}:{self.repo} --prompt "Hello"'
        )
        return f"```bash\n{command}\n```\n"


@dataclass(frozen=True)
class Layout:
    """One export layout: `write(head_folder, out, options) -> Written` writes it into `out` and reads it
    back with `read` (comparing tensor by tensor); `read(folder, target=None)` is what `--draft` loads (a
    kind's engine layouts leave it None: HeadKind.all_layouts gives them the kind's `read`);
    `serve(ServeArgs)` is the card's serve section; `reads` names the option (`verifier` or `target`) whose
    folder it reads besides the head, so export keeps `--out` apart from it; `about` is its line in
    `draftsmith export --help` (which lists the registry's layouts)."""

    write: Callable[[Path, Path, LayoutOptions], Written]
    serve: Callable[[ServeArgs], str]
    read: Callable | None = None
    reads: str | None = None
    about: str = ""
    # `export --quantize fp8`: "" = the writer cannot carry FP8, "any" = under any --engine, else the one
    # --engine whose loader was checked (runtime/heads/fp8_checkpoint.py); `no_fp8` = why not, for errors
    fp8: str = ""
    no_fp8: str = ""


@dataclass(frozen=True)
class VllmServe:
    """How vLLM serves a kind: the export layout it loads and the `speculative_config` naming it
    (vllm/config/speculative.py: `method`, `model`, `num_speculative_tokens`). `draftsmith bench
    --baselines vllm-KIND:DIR` (runtime/bench/vllm_method.py) and the model cards' serve texts read it."""

    layout: str  # the kind's export layout vLLM loads (a key of HeadKind.layouts), written with vLLM's ids
    method: str  # speculative_config's "method"
    extra: dict = field(default_factory=dict)  # more speculative_config keys (P-EAGLE: parallel_drafting)
    # the export is the target with the draft inside (MTP's MiMo layout): vLLM serves that folder as the
    # model, and the speculative config names no draft model
    in_target: bool = False

    def speculative_config(self, folder: str, tokens: int) -> dict:
        """The `--speculative-config` of an export in `folder` drafting `tokens` tokens per step."""
        model = {} if self.in_target else {"model": folder}
        return {"method": self.method, **model, "num_speculative_tokens": tokens, **self.extra}

    def serve_command(self, args: ServeArgs, tokens: int | None = None) -> str:
        """The fenced `vllm serve` of an export drafting `tokens` (default: the card's) per step: the target
        with the export as its draft, or the export itself when the draft is inside it."""
        tokens = args.speculative_tokens if tokens is None else tokens
        spec = json.dumps(self.speculative_config(args.repo, tokens))
        model = args.repo if self.in_target else args.target
        return f"```bash\nvllm serve {model} --speculative-config '{spec}'\n```\n"


@dataclass(frozen=True)
class HeadKind:
    name: str
    title: str  # the model card's title words, e.g. "EAGLE-3 draft head"
    about: str  # what `--draft NAME:DIR` loads, in `draftsmith generate --help` (runtime/cli/args.py)
    module_class: Callable[[], type]  # -> the module class (imported when asked: the registry stays light)
    section: type  # a HeadSection subclass
    read: Callable  # (folder, target=None) -> the head in our folder or any of the kind's engine layouts
    spec: str  # the `--draft` form its help lists, e.g. "mtp:DIR[#recursive]"
    layouts: dict[str, Layout] = field(default_factory=dict)  # engine layouts ("draftsmith" is added)
    # (arg) -> the default chain depth for `--draft NAME:ARG` (None: the registry's default, 2)
    default_depth: Callable[[str], int | None] = lambda arg: None
    cotrain: bool = False  # the target may train with the head (train config `cotrain.enabled`)
    confidence: bool = False  # a confidence head: its drafter fills DraftBatch.survival (adaptive:K's source)
    # (arg, spec) -> the TreeSpec `--tree SPEC` means for `--draft NAME:ARG`, for a kind with trees of its
    # own (Medusa's cartesian:, sparse:); None: runtime/tree.parse_tree_spec
    parse_tree: Callable[[str, str], object] | None = None
    vllm: VllmServe | None = None  # how vLLM serves the kind (None: it does not)
    # (arg) -> (its folder, the drafter's options) for `--draft NAME:ARG` (mtp:DIR#recursive); default: none
    draft_arg: Callable[[str], tuple[str, dict]] = lambda arg: (arg, {})

    @property
    def module(self) -> type:
        return self.module_class()

    def load_draft(self, arg: str, target) -> tuple:
        """`--draft NAME:ARG` -> the head on the target's device and dtype, and its drafter's options."""
        folder, options = self.draft_arg(arg)
        return self.read(folder, target).to(device=target.device, dtype=target.dtype), options

    def all_layouts(self) -> dict[str, Layout]:
        def read(folder, target=None):
            return self.module.from_pretrained(folder, target)

        own = Layout(write=copy_own_folder, read=read, serve=serve_own, about=OWN_ABOUT)
        engines = {
            name: replace(layout, read=layout.read or self.read) for name, layout in self.layouts.items()
        }
        return {"draftsmith": own, **engines}


# ---- draftsmith's own layout, the same for every kind -----------------------------------------------------
OWN_ABOUT = "our folder (config.json + model.safetensors), what --draft KIND:DIR reads"


def copy_own_folder(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """Our folder as it is (config.json, model.safetensors, a co-trained target/), without its card."""
    for item in folder.iterdir():
        if item.name == "README.md":
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    config = read_json(folder / CONFIG_FILE, "CHECKPOINT")
    if not isinstance(config.get("target"), str):
        raise BadInputError("CHECKPOINT", str(folder), f"a head folder whose {CONFIG_FILE} names its target")
    tensors = load_tensors(folder / WEIGHTS_FILE, "CHECKPOINT")
    return Written(config["target"], config, parameter_summary(tensors))


def serve_own(args: ServeArgs) -> str:
    formats = "|".join(args.formats)
    export = f" (`draftsmith export {args.repo} --format {formats}`)" if formats else ""
    return (
        f"## Use\n\ndraftsmith's own layout. Serve it with draftsmith, or export it for an engine{export}:"
        f"\n\n{args.generate}"
    )
