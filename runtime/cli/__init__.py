"""The `draftsmith` command (CLI layer: may import everything; lazy imports per verb keep it light).

`main` (the console script: one verb per job; `python -m draftsmith.runtime.cli`), `args` (shared
argparse pieces), `bench`, `eval`, `calibrate`, `data`, `export` (the verbs' flags; the work lives
elsewhere), `ssd`
(generate's --ssd and --draft-process flags), `verb_texts` (each verb's summary and description for
--help), `demo` (`draftsmith demo`: data -> train -> head -> bench -> export).
"""
