"""Architecture guards: the runtime imports without the training stack; the CLI imports lazily."""

import subprocess
import sys

HEAVY = ["accelerate", "deepspeed", "datasets", "wandb"]


def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_runtime_imports_without_training_stack():
    loaded = modules_after(
        "import draftsmith.runtime, draftsmith.runtime.target, draftsmith.runtime.engine,"
        " draftsmith.runtime.side_by_side, draftsmith.runtime.demo, draftsmith.runtime.cli"
    )
    assert "draftsmith.runtime.target" in loaded
    assert not [m for m in HEAVY if m in loaded]


def test_cli_module_is_light():
    loaded = modules_after("import draftsmith.runtime.cli")
    assert "torch" not in loaded and "transformers" not in loaded


def test_packages_live_under_one_import_root():
    import draftsmith.configs
    import draftsmith.data_recipes
    import draftsmith.kernels
    import draftsmith.runtime
    import draftsmith.train

    for mod in (draftsmith.runtime, draftsmith.train, draftsmith.kernels, draftsmith.data_recipes):
        assert mod.__doc__
    assert draftsmith.configs.__name__ == "draftsmith.configs"
