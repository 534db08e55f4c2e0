"""``tessera``: the command line, modelled on Run:ai's CLI (v1 ``submit`` and v2 ``training submit``).

Every command talks to the REST API; ``up`` and ``down`` also start and stop the local server.
Errors are one line on stderr; exit 0 ok, 1 user error, 2 server unreachable.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import typer.main

# Importing a command module registers its commands, in the order of ``tessera --help``.
from tessera.cli import server_commands  # isort: skip
from tessera.cli import project_commands  # isort: skip
from tessera.cli import submit_commands  # isort: skip
from tessera.cli import workload_commands  # isort: skip
from tessera.cli import tenancy_commands  # isort: skip
from tessera.cli.app import cli
from tessera.cli.client import CliError
from tessera.cli.flags import RAW_ARGV, TRAILING
from tessera.cli.server_commands import up
from tessera.cli.workload_commands import KIND_GROUPS, _add_kind_groups
from tessera.core.error_text import plain

__all__ = ["app", "cli", "project_commands", "server_commands", "submit_commands",
           "tenancy_commands", "up", "workload_commands"]


def _top_level_names() -> set[str]:
    names = {"project", "config", "user", "access-rule", "department", "report"}
    names.update(_command_name(c) for c in cli.registered_commands)
    return names


_INVALID = re.compile(r"^Invalid value for ((?:'[^']+'(?: / )?)+): ")


def _flag_first(message: str, argv: list[str]) -> str:
    """Click's "Invalid value for '--deserved' / '--gpu': RULE" as tessera words every refusal:
    the flag the user typed first, then the rule."""
    m = _INVALID.match(message)
    if not m:
        return message
    names = re.findall(r"'([^']+)'", m.group(1))
    typed = next((n for n in names if any(a == n or a.startswith(n + "=") for a in argv)), names[0])
    return f"{typed}: {message[m.end():]}"


def _command_name(c: Any) -> str:
    callback = c.callback
    return str(c.name or (callback.__name__.replace("_", "-") if callback else ""))


def _click_app(argv: list[str]) -> Any:
    """The click command to run: when the first argument names a top-level command or group,
    a group of that one alone (its siblings' parameters are not built: Typer builds every
    command's options from its signature on each run, most of a start-up); otherwise
    (``--help``, no arguments, a misspelt command and its suggestions) the whole tree. What
    that command parses, prints and refuses is the same either way: click resolves the first
    word to it and nothing at the top level but ``--help`` exists."""
    first = argv[0] if argv else ""
    if not first.startswith("-"):
        commands = [c for c in cli.registered_commands if _command_name(c) == first]
        groups = [g for g in cli.registered_groups if g.name == first]
        if commands or groups:
            view = copy.copy(cli)
            view.registered_commands, view.registered_groups = commands, groups
            return typer.main.get_group(view)
    return typer.main.get_command(cli)


class _App:
    """The console script: runs the Typer app and turns every failure into one line and a code."""

    def __call__(self, args: list[str] | None = None) -> None:
        argv = list(sys.argv[1:] if args is None else args)
        RAW_ARGV[:] = argv
        TRAILING.clear()
        words = [a for a in argv if not a.startswith("-")][:2]
        if "submit" in words and "--" in argv:
            cut = argv.index("--")
            TRAILING.append(argv[cut + 1:])
            argv = argv[:cut]
        args = argv
        first = next((a for a in argv if not a.startswith("-")), None)
        names = {name for _, name in KIND_GROUPS}
        if first in names:
            _add_kind_groups(first)
        elif first is None or first not in _top_level_names():
            _add_kind_groups(None)
        try:
            prog = "runai" if Path(sys.argv[0]).name == "runai" else "tessera"
            result = _click_app(args)(args=args, standalone_mode=False, prog_name=prog)
        except CliError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(exc.code)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as exc:
            # Typer's (vendored) click raises usage errors and aborts here in non-standalone mode.
            if hasattr(exc, "format_message"):
                message = exc.format_message()
                if not message:
                    sys.exit(0)
                print(f"error: {_flag_first(plain(message), argv)}", file=sys.stderr)
                sys.exit(1)
            if type(exc).__name__ == "Abort":
                print("error: aborted", file=sys.stderr)
                sys.exit(1)
            raise
        sys.exit(result if isinstance(result, int) else 0)


app = _App()

if __name__ == "__main__":
    app()
