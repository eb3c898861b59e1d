"""Folders a user may have edited: a command never overwrites a file there that it did not write itself.

`cglib student-version --out DIR` writes notebooks a student then works in; `cglib report --out DIR` and
`cglib book --out DIR` write a site into a folder the user names. Each checks first, and refuses with the files'
names and the fix, rather than replacing a user's work:

- a notebook folder: `existing_targets` lists the files a write would replace; the caller refuses, skips them
  (`--update`) or replaces each after keeping it as a backup (`--force`, `keep_backup`);
- a site folder: `check_site_folder` accepts a new or empty folder, or one holding the marker file this command
  left at its last build (`mark_site_folder`); anything else is refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path


class UserFilesInTheWay(FileExistsError):
    """A write would replace files a user may have made or edited; the message names them and the fix."""


def existing_targets(targets: list[Path]) -> list[Path]:
    """The files among `targets` that already exist (what a write would replace)."""
    return [path for path in targets if path.exists()]


def keep_backup(path: Path) -> Path:
    """Move `path` to a backup beside it before it is replaced: `NAME.bak`, or `NAME.bak2`, `NAME.bak3`, ... when
    earlier backups exist (none is ever overwritten). Returns the backup's path."""
    backup = path.with_name(path.name + ".bak")
    number = 1
    while backup.exists():
        number += 1
        backup = path.with_name(f"{path.name}.bak{number}")
    shutil.copy2(path, backup)
    return backup


def names(paths: list[Path], most: int = 6) -> str:
    """The file names of `paths` for a message: the first `most`, then how many more."""
    shown = ", ".join(p.name for p in paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def site_marker(command: str) -> str:
    """The marker file `cglib COMMAND` leaves in a folder it built (`.cglib-report`, `.cglib-book`)."""
    return f".cglib-{command}"


def check_site_folder(folder: Path, command: str) -> None:
    """Refuse to build into `folder` when it holds files and no marker of an earlier `cglib COMMAND` build there:
    they are someone else's, and a build replaces the folder's pages."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UserFilesInTheWay(f"{folder} is a file, not a folder; choose another --out for cglib {command}")
    if (folder / site_marker(command)).is_file():
        return
    present = sorted(folder.iterdir())
    if present:
        raise UserFilesInTheWay(
            f"{folder} already holds {len(present)} files or folders that cglib {command} did not write "
            f"({names(present)}); a build would replace them. Choose a new or empty folder for --out (cglib "
            f"{command} marks the folders it builds with {site_marker(command)} and rebuilds those in place)")


def mark_site_folder(folder: Path, command: str) -> None:
    """Leave the marker that lets a later `cglib COMMAND` rebuild `folder` in place."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / site_marker(command)).write_text(
        f"built by cglib {command}; a later cglib {command} --out here replaces this folder's pages\n",
        encoding="utf-8")
