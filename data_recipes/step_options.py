"""The numeric options of `draftsmith data regenerate | capture`, checked before an engine is chosen.

    check_step_options(args)   # BadInputError (exit 2) naming the first bad flag; nothing loaded or started

Each engine checks only the options it reads, and later: draftsmith's engine refuses `--batch-size 0` once
the target is loaded, while the vLLM path (`--engine vllm`, or what `--engine auto` picks,
engine_choice.py) never reads --batch-size, and draftsmith's engine never reads --tensor-parallel-size or
--max-num-seqs, so a bad value of those passed silently on one engine and failed on the other. Checking
every such flag here, in the CLI before engine_choice, makes a command valid or not whatever the engine
(the engines keep their own checks for their Python callers). Run through the CLI:
`draftsmith data regenerate ... --batch-size 0` exits 2 naming --batch-size (tests/data_recipes/
test_step_options.py).
"""

from __future__ import annotations

from draftsmith.data_recipes.parts import check_shard_args
from draftsmith.runtime.errors import BadInputError

# argparse dest -> (flag, least value); a dest a step does not have (capture has no --batch-size) or left
# unset (--tp-size: all processes) is skipped. The least values are the ones the steps refuse below.
MINIMUMS = {
    "batch_size": ("--batch-size", 1),  # regenerate.py
    "max_new_tokens": ("--max-new-tokens", 1),  # regenerate.py, vllm_regenerate.py
    "shard_tokens": ("--shard-tokens", 1),  # capture.py
    "tp_size": ("--tp-size", 1),  # tp_steps.py / placement.py
    "ep_size": ("--ep-size", 1),
    "process_group_timeout_s": ("--process-group-timeout-s", 1),  # tp_steps.py
    "tensor_parallel_size": ("--tensor-parallel-size", 1),  # vllm_engine.check_tensor_parallel
    "max_num_seqs": ("--max-num-seqs", 1),  # vllm_regenerate.py
}


def check_step_options(args) -> None:
    """Refuse a bad numeric option of a regenerate or capture command line (argparse has made them ints)."""
    if hasattr(args, "num_shards"):
        check_shard_args(args.num_shards, args.shard_index)  # parts.py: [1, 99999] and [0, N-1]
    for dest, (flag, least) in MINIMUMS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BadInputError(flag, value, f"an integer >= {least}")
    if hasattr(args, "temperature"):  # regenerate: both engines validate these, after loading the target
        from draftsmith.runtime.verify.sampling import SamplingParams

        SamplingParams(args.temperature, args.top_p, args.top_k).validate()
