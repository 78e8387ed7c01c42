"""draftsmith.runtime: everything serving needs, importable without accelerate, deepspeed, datasets or wandb.

Its sub-packages and modules, in import order: each imports only those before it, never after, not even
inside a function (tests/test_imports.py checks the order, that every module is named, and that the
serving core imports neither draftsmith.train nor draftsmith.data_recipes):
  1. `errors`: the errors users see (exit code 2 for bad input) and the readers of their files;
  2. `verify`: draft trees, the device-resident DraftBatch, sampling and the lossless acceptance rules
     (pure torch);
  3. `core`: the target adapter, its caches and masks, plain and speculative decoding (the static,
     graphed engine path included), configs;
  4. `heads`: the head-kind registry, the heads (EAGLE-3, P-EAGLE, MTP, Medusa, DFlash) and the layouts
     engines load;
  5. `drafters`: the drafter protocol, `--draft` specs, the tree grower and every step model;
  6. `speculator`: the one speculation builder: a SpecConfig -> build_speculator(target, cfg) -> a
     Speculator, used by `generate`, `bench`, the demo and SSD;
  7. `workers`: what runs in another Python (vLLM's, llama.cpp's) and the pipe to it;
  8. `bench` (`draftsmith bench`: methods, peers, timing and reports) and 9. `cli` (the `draftsmith`
     command and `draftsmith demo`): they may import everything above; nothing in train, data_recipes
     or kernels imports them.

Moved in the sub-package split (issue 23): `draftsmith.runtime.X` is now `draftsmith.runtime.<family>.X`
(for example `runtime.target` -> `runtime.core.target`, `runtime.eagle3` -> `runtime.heads.eagle3`), and
prefixed names lost their prefix: `cli` -> `cli.main`, `cli_args|bench|data|export` -> `cli.args|bench|
data|export`, `demo` -> `cli.demo`, `bench` -> `bench.compare`, `bench_methods|report|run|types` ->
`bench.methods|report|run|types`; later (issue 41) `core.errors` -> `errors`, `static.forward` ->
`core.static_forward`, `static.draft` -> `drafters.static_steps`. docs/architecture.md lists them.

Words: target (the model whose distribution is preserved), draft/drafter, head (a trained draft module on
the target's features), tree (nodes with parents; a path runs root to leaf), accepted / recovered / bonus
tokens, tau = mean tokens committed per target forward (bonus included). Shapes: B batch, T tokens,
N tree nodes, K depth, V vocab, H hidden, L layers.
"""
