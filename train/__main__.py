"""`python -m draftsmith.train --config CONFIG [key=value ...]`: what `accelerate launch -m` runs.

    accelerate launch --config_file configs/accelerate/ddp-cpu.yaml -m draftsmith.train \\
        --config configs/eagle3-smollm2-135m.yaml train.max_steps=20 output_dir=runs/ddp

The same job as `draftsmith train`; exit codes 0 / 1 / 2 as the CLI's. Multi-process runs leave with
os._exit after flushing: gloo can deadlock in its destructor at interpreter exit (a torch deadlock).
"""

import os
import sys

from draftsmith.runtime.cli.main import main

if __name__ == "__main__":
    code = main(["train", *sys.argv[1:]])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
