"""`python -m draftsmith.runtime.cli ...`: the `draftsmith` command (also under torchrun)."""

from draftsmith.runtime.cli.main import exit_with, main

if __name__ == "__main__":
    exit_with(main())  # exit code 2 for bad input, as the `draftsmith` script
