"""draftsmith.runtime: everything serving needs, importable without accelerate, deepspeed, datasets or wandb.

Its sub-packages and its one module, by family (each sub-package's docstring maps its modules;
tests/test_imports.py checks that every module is named and that the import rule holds):
- the serving core (it imports neither draftsmith.train nor draftsmith.data_recipes, not even inside a
  function, nor the CLI and bench layer below):
  - `core`: the target adapter, its caches and masks, plain and speculative decoding, configs and errors;
  - `verify`: draft trees, sampling and the lossless acceptance rules (pure torch);
  - `heads`: the head-kind registry, the heads (EAGLE-3, MTP, Medusa) and the layouts engines load;
  - `drafters`: the drafter protocol, `--draft` specs, and every drafter;
  - `static`: the GPU engine path (static caches, CUDA graphs);
  - `workers`: what runs in another Python (vLLM's) and the pipe to it;
- `speculator`: the one speculation builder above the serving core (it imports core, verify, heads and
  drafters; none of them imports it): a SpecConfig -> build_speculator(target, cfg) -> a Speculator, used by
  `generate`, `bench`, the demo and SSD;
- the CLI, demo and bench layer (may import everything; nothing in the core, train, data_recipes or
  kernels imports it): `cli` (the `draftsmith` command and `draftsmith demo`) and `bench` (`draftsmith
  bench`: methods, peers, timing and reports).

Moved in the sub-package split (issue 23): `draftsmith.runtime.X` is now `draftsmith.runtime.<family>.X`
(for example `runtime.target` -> `runtime.core.target`, `runtime.eagle3` -> `runtime.heads.eagle3`), and
prefixed names lost their prefix: `cli` -> `cli.main`, `cli_args|bench|data|export` -> `cli.args|bench|
data|export`, `demo` -> `cli.demo`, `bench` -> `bench.compare`, `bench_methods|report|run|types` ->
`bench.methods|report|run|types`, `static_forward|draft` -> `static.forward|draft`. README lists them.

Words: target (the model whose distribution is preserved), draft/drafter, head (a trained draft module on
the target's features), tree (nodes with parents; a path runs root to leaf), accepted / recovered / bonus
tokens, tau = mean tokens committed per target forward (bonus included). Shapes: B batch, T tokens,
N tree nodes, K depth, V vocab, H hidden, L layers.
"""
