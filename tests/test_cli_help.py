"""Every ``slurm-gpu`` command and subcommand's ``--help`` says what it does, lists its options
and shows one example that calls that very command."""
from __future__ import annotations

from typing import Iterator, List, Tuple

import click
import pytest

from slurm_hooks.cli import SUBCOMMANDS, main

from .conftest import run_cli


def walk(command: click.Command, path: List[str]) -> Iterator[Tuple[List[str], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, name), path + [name])


COMMANDS = list(walk(main, []))


def test_the_walk_reaches_every_subcommand_and_their_subcommands():
    top = {path[0] for path, _ in COMMANDS if len(path) == 1}
    assert top == set(SUBCOMMANDS)
    assert ["lab", "up"] in [path for path, _ in COMMANDS] and ["sim", "profiles"] in [p for p, _ in COMMANDS]


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "slurm-gpu" for p, _ in COMMANDS])
def test_help_says_what_it_does_its_options_and_one_example(path, command):
    result = run_cli([*path, "--help"])
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    first = (command.help or "").strip().splitlines()
    flat = " ".join(text.split())
    assert first and len(first[0]) > 15 and " ".join(first[0].split()) in flat, f"{path}: no description"
    assert "Options:" in text and "--help" in text
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.opts[0] in text, f"{path}: option {param.opts[0]} not in --help"
            assert param.help, f"{path}: option {param.opts[0]} has no help text"
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("Example:")]
    assert len(examples) == 1, f"{' '.join(path)}: --help needs exactly one 'Example:' line"
    assert " ".join(["slurm-gpu", *path]) in examples[0], examples[0]


@pytest.mark.parametrize("hook", ["prolog", "epilog", "taskprolog"])
def test_the_job_hooks_answer_help_with_an_example_and_refuse_arguments(hook, capsys):
    import importlib

    module = importlib.import_module(f"slurm_hooks.{hook}")
    assert module.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: slurm-gpu-{hook}") and "-h, --help" in out
    example = out.split("Example:\n", 1)[1]
    assert f"slurm-gpu-{hook}" in example and "SLURM_JOB_ID=" in example
    assert module.main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--bogus" in err
