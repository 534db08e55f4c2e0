"""The data directory is this user's own before the admin secret is written
(tessera.api.datadir): another user's directory, a symlinked directory or entry are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.api.datadir import DataDirUnsafe, check_data_dir

NOBODY = 65534


def _server(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.local.server", "--port", "0", "--data-dir", str(data),
         "--simulate", "1xV100-16GB"], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_directory_with_a_symlinked_secret_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    trap = tmp_path / "their-file"
    trap.write_text("")
    os.symlink(trap, theirs / "credentials.json")
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(trap, NOBODY, NOBODY)
    done = _server(theirs)
    assert done.returncode == 1, done.stderr
    assert f"data directory {theirs} belongs to" in done.stderr
    assert "uid 65534" in done.stderr and "--data-dir" in done.stderr, done.stderr
    assert trap.read_text() == "", "the admin secret was written into another user's file"
    assert not (theirs / "server.lock").exists()


def test_a_symlinked_entry_in_ones_own_directory_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    trap = tmp_path / "elsewhere"
    trap.write_text("")
    os.symlink(trap, mine / "credentials.json")
    done = _server(mine)
    assert done.returncode == 1
    assert f"{mine / 'credentials.json'} in the data directory is a symlink" in done.stderr
    assert trap.read_text() == ""


def test_a_symlinked_directory_and_a_foreign_entry_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    os.symlink(real, link)
    with pytest.raises(DataDirUnsafe, match="is a symlink"):
        check_data_dir(link)
    if os.geteuid() == 0:
        (real / "tessera.db").write_text("")
        os.chown(real / "tessera.db", NOBODY, NOBODY)
        with pytest.raises(DataDirUnsafe, match=r"tessera.db in the data directory belongs to"):
            check_data_dir(real)


def test_a_new_directory_is_made_private_and_a_loose_one_of_ours_is_tightened(
        tmp_path: Path) -> None:
    new = tmp_path / "a" / "b"
    check_data_dir(new)
    assert new.stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    check_data_dir(loose)
    assert loose.stat().st_mode & 0o777 == 0o700
