"""`python -m draftsmith.runtime.cli ...`: the `draftsmith` command (also under torchrun)."""

from draftsmith.runtime.cli.main import main

if __name__ == "__main__":
    main()
