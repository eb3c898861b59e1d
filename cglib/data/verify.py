"""What is wrong with a fetched file, in one line: its structure (a zip that opens and holds its members, a gzip
that decompresses to its end, a whole JPEG), its pinned size, then its pinned checksums. `cglib.data.download`
verifies every file with `file_problem` before it moves it into place.
"""

from __future__ import annotations

import gzip
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from cglib.run import file_digest


class DownloadError(RuntimeError):
    """A download failed for good (HTTP error, or the connection kept dropping after all retries)."""


class BadDownload(DownloadError):
    """A fetched file failed its verification (truncated, not the archive it should be, a member missing, a
    checksum mismatch); the file has been deleted."""


class ChecksumError(BadDownload, ValueError):
    """A downloaded file's digest differs from the expected one (the file has been deleted)."""


def _checksum_problem(path: Path, sha256: str | None, md5: str | None) -> str | None:
    """None when the file matches every given checksum, else a message with both digests."""
    for algorithm, expected in (("sha256", sha256), ("md5", md5)):
        if expected is not None:
            actual = file_digest(path, algorithm)
            if actual != expected.lower():
                return f"{algorithm} mismatch: expected {expected.lower()}, got {actual}"
    return None


def _size_problem(path: Path, size_bytes: int | None) -> str | None:
    """None when the file has the pinned size (or none is pinned), else what is wrong with it."""
    if size_bytes is None:
        return None
    size = path.stat().st_size
    if size < size_bytes:
        return f"truncated: {size:,} of {size_bytes:,} bytes"
    if size > size_bytes:
        return f"{size:,} bytes where {size_bytes:,} are expected: not the file this download names"
    return None


def _looks_like(path: Path) -> str:
    """What a file that should be an archive or an image seems to be instead, from its first bytes."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "an empty file"
    if head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "an HTML page (a server's error or login page?)"
    return f"a file beginning with {head[:8]!r}"


def zip_problem(path: Path, members: tuple[str, ...] = ()) -> str | None:
    """None when `path` is a zip whose directory reads and that holds every one of `members`, else what is wrong
    (its central directory is read, not every member's bytes: cheap on an 18 GiB archive)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            zip_start = f.read(4) == b"PK\x03\x04"
        if zip_start:
            return f"truncated: a zip archive cut before its end ({path.stat().st_size:,} bytes, no central directory)"
        return f"not a zip archive: it is {_looks_like(path)}"
    missing = [m for m in members if m not in names and not any(n.startswith(m.rstrip("/") + "/") for n in names)]
    if missing:
        return f"a zip without the member {missing[0]}: not the archive this download names"
    return None


def gzip_problem(path: Path) -> str | None:
    """None when `path` decompresses as gzip to its end, else what is wrong."""
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except EOFError:
        return f"truncated: a gzip file cut before its end ({path.stat().st_size:,} bytes)"
    except (OSError, zlib.error) as exc:
        return f"not a gzip file ({exc}): it is {_looks_like(path)}"
    return None


def jpeg_problem(path: Path) -> str | None:
    """None when `path` begins and ends as a JPEG image does, else what it is instead."""
    with open(path, "rb") as f:
        head = f.read(3)
        f.seek(max(0, path.stat().st_size - 2))
        tail = f.read(2)
    if head != b"\xff\xd8\xff":
        return f"not a JPEG image: it is {_looks_like(path)}"
    if tail != b"\xff\xd9":
        return "truncated: a JPEG image cut before its end"
    return None


def file_problem(path: Path, size_bytes: int | None, sha256: str | None, md5: str | None,
             check: Callable[[Path], str | None] | None) -> tuple[type[BadDownload], str] | None:
    """The first thing wrong with a fetched file, with the error it raises: its structure (`check`: it says best
    what a wrong file is, an HTML page or a cut archive), its size, then its checksums; None when it passes."""
    problem = (check(path) if check is not None else None) or _size_problem(path, size_bytes)
    if problem is not None:
        return BadDownload, problem
    problem = _checksum_problem(path, sha256, md5)
    return None if problem is None else (ChecksumError, problem)
