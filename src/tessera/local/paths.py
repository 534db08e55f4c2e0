"""Where embedded mode keeps its data and the CLI its settings."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DEFAULT_PORT = 8470


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The server's data directory: ``--data-dir``, else ``$TESSERA_DATA_DIR``, else the user's."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("TESSERA_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return Path(platformdirs.user_data_dir("tessera", appauthor=False))


def config_file() -> Path:
    """The CLI's settings (server URL, token, current project)."""
    env = os.environ.get("TESSERA_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_config_dir("tessera", appauthor=False)) / "config.json"
