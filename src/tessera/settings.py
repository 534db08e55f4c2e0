"""Settings every entry point shares: the API's default port, where a server keeps its data
(embedded mode's database, API tokens) and where the CLI keeps its own settings.

Neutral ground so the CLI and the Kubernetes API server need not import embedded mode for them.
"""

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
