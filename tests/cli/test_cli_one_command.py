"""`tessera NAME ...` builds the click group from NAME's registration alone (main._click_app: the
other commands' parameters are not built on that run). Each top-level command and group must
print the same help built alone as in the whole tree, each group's subcommands must have the same
parameters, and building one must leave the app's registrations as they were (an in-process
caller runs it again)."""

from __future__ import annotations

from typing import Any

import pytest
import typer.main

from tessera.cli.main import _click_app, cli
from tessera.cli.workload_commands import _add_kind_groups


def _help(group: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = group(args=[*args, "--help"], standalone_mode=False, prog_name="tessera")
    assert code in (0, None)
    return capsys.readouterr().out


def _shape(command: Any) -> list[Any]:
    """What a command parses and says, parameter by parameter (the subcommands, recursively)."""
    params = [(p.name, p.opts, p.secondary_opts, p.required, repr(p.default), p.nargs, p.multiple,
               getattr(p, "help", None), getattr(p, "hidden", None), type(getattr(p, "type", None)).__name__, type(p).__name__)
              for p in command.params]
    subs = getattr(command, "commands", {})
    return [command.name, command.help, command.hidden, params,
            [_shape(subs[n]) for n in sorted(subs)]]


def test_each_command_built_alone_prints_the_help_of_the_whole_tree(
        capsys: pytest.CaptureFixture[str]) -> None:
    _add_kind_groups(None)
    registered = (list(cli.registered_commands), list(cli.registered_groups))
    full = typer.main.get_command(cli)
    names = sorted(full.commands)  # type: ignore[attr-defined]
    assert {"submit", "list", "up", "project", "training", "report"} <= set(names)
    for name in names:
        alone = _click_app([name, "--help"])
        assert list(alone.commands) == [name]
        assert _shape(alone.commands[name]) == _shape(full.commands[name])  # type: ignore[attr-defined]
        whole = _help(full, [name], capsys)
        assert f"Usage: tessera {name} " in whole, name
        assert _help(alone, [name], capsys) == whole, name
    assert (cli.registered_commands, cli.registered_groups) == registered
