"""Rules for every piece of text a user hands tessera: names, commands, arguments, environment,
images, working directories, annotations.

Text ends up in places that cannot hold everything a JSON string can: an ``execve`` argument or
environment entry cannot contain a NUL byte, UTF-8 (SQLite, the kernel, HTTP responses) cannot
encode a lone UTF-16 surrogate, and the kernel refuses a single argument over 128 KiB. Such a
value must be refused when it is submitted, naming the field, never accepted and left to fail
later (where it once stopped every scheduling cycle). Every front end (REST API models, the
shared submission checks of both backends, the admission webhook) calls :func:`check_text`.
"""

from __future__ import annotations

from tessera.core.errors import InvalidRequest

MAX_NAME = 63
MAX_ARG = 128 * 1024
"""One argument, one environment value (the kernel's MAX_ARG_STRLEN is 128 KiB)."""
MAX_COMMAND = 128 * 1024
"""A command line (command plus args) before it is split."""
MAX_ARGV = 4096
"""Arguments in one command."""
MAX_ENV = 1024
"""Environment variables of one workload."""
MAX_ENV_NAME = 256
MAX_ENV_TOTAL = 512 * 1024
"""Bytes of all environment values together (Linux allows 2 MiB for argv plus environment)."""
MAX_PATH = 4096
MAX_IMAGE = 1024
MAX_SHORT = 1024
"""Any other short field: a GPU model list, a quantity, a project id."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be passed on, or None: a NUL byte or a lone surrogate."""
    if "\x00" in value:
        return "must not contain a NUL byte (\\x00): a program's arguments and environment cannot hold one"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        return (f"must be valid Unicode text: it holds a lone UTF-16 surrogate "
                f"(U+{ord(bad):04X}) at character {exc.start}, which has no UTF-8 form")
    return None


def shown(value: str, limit: int = 60) -> str:
    """A value safe to quote in an error: short, and ASCII-escaped where it is odd."""
    text = value if len(value) <= limit else value[:limit] + "…"
    return text.encode("ascii", "backslashreplace").decode() if text_problem(text) else text


def check_text(value: object, field: str, max_len: int = MAX_SHORT) -> str:
    """``value`` as text that any process, file and HTTP response can carry; else refused
    naming ``field``."""
    if not isinstance(value, str):
        raise InvalidRequest(field, "must be text", type(value).__name__)
    if len(value) > max_len:
        raise InvalidRequest(field, f"must be at most {max_len} characters (got {len(value)})")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidRequest(field, problem, shown(value))
    return value


def check_argv(argv: list[str], field: str = "spec.command") -> None:
    """A command's arguments, as a list (after shell splitting)."""
    if len(argv) > MAX_ARGV:
        raise InvalidRequest(field, f"must have at most {MAX_ARGV} arguments (got {len(argv)})")
    for i, arg in enumerate(argv):
        check_text(arg, f"{field}[{i}]", MAX_ARG)


def check_env(env: dict[str, str], field: str = "spec.environmentVariables") -> None:
    """Environment variables: names a shell can export, values a process can receive."""
    if len(env) > MAX_ENV:
        raise InvalidRequest(field, f"must have at most {MAX_ENV} variables (got {len(env)})")
    total = 0
    for name, value in env.items():
        check_text(name, f"{field}[{shown(str(name))}].name", MAX_ENV_NAME)
        if not name or "=" in name:
            raise InvalidRequest(f"{field}[{shown(name)}].name",
                                 "must be a non-empty name without '='", shown(name))
        check_text(value, f"{field}[{name}].value", MAX_ARG)
        total += len(value.encode()) + len(name) + 2
    if total > MAX_ENV_TOTAL:
        raise InvalidRequest(field, f"must hold at most {MAX_ENV_TOTAL // 1024} KiB in all "
                             f"(got {total // 1024} KiB)")
