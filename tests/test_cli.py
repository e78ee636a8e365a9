"""The ``petra`` command as a newcomer meets it: it answers at once, and says what it does.

(Errors that end in one line and an exit status: tests/test_cli_errors.py.)
"""

import subprocess
import sys

HEAVY = ("torch", "torchvision", "pandas")


def heavy_imports(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_importing_the_cli_imports_no_torch():
    assert heavy_imports("import petra_core.cli") == []


def test_help_and_a_config_typo_import_no_torch():
    """``petra --help`` and ``petra train bad_key=1`` answer before torch would be imported."""
    code = (
        "import contextlib, io\n"
        "from petra_core.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "with contextlib.redirect_stderr(io.StringIO()):\n"
        "    assert main(['train', 'bad_key=1']) == 2\n"
    )
    assert heavy_imports(code) == []


def subcommands():
    import argparse

    from petra_core.cli import build_parser

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices.items()


def test_every_subcommand_says_what_it_does_and_every_option_has_a_help():
    missing = []
    for name, parser in subcommands():
        if not parser.description:
            missing.append(f"petra {name}: no description")
        for action in parser._actions:
            if action.dest != "help" and not action.help:
                missing.append(f"petra {name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)


def test_version_is_the_package_version(capsys):
    import pytest

    import petra_core
    from petra_core.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"petra {petra_core.__version__}"


def test_a_profile_by_name_and_an_unknown_one(capsys):
    from petra_core.cli import main

    assert main(["train", "--profile", "smoke", "epoch=1"]) == 2
    assert "unknown config key 'epoch' (did you mean 'epochs'?)" in capsys.readouterr().err
    assert main(["train", "--profile", "no-such-profile"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'no-such-profile'" in err and "smoke" in err and "cpu" in err and "\n" not in err


def test_a_yaml_error_names_its_line_and_column(tmp_path, capsys):
    from petra_core.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: 1\nwidth: [4\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"'{bad}' line 3, column 1 is not valid YAML" in err and "\n" not in err
