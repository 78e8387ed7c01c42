"""Kernel tests run Triton's interpreter on CPU: TRITON_INTERPRET must be set before Triton compiles (at
the import of draftsmith.kernels.triton_kernels), so it is set here, when pytest collects this folder."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
