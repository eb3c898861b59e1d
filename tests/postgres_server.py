"""A real PostgreSQL server for tests, from Debian's `postgresql` package (.ci/run installs it).

Debian keeps the server binaries in /usr/lib/postgresql/<version>/bin, off PATH. The cluster is made by `initdb`
in a temporary folder and served on a free loopback port with trust authentication (nothing else can reach it);
initdb and the server refuse to run as root, so under root (CI) they run as the `postgres` user the package creates
(else `nobody`). `postgres_server()` yields a function that creates a database and returns its URL; the server is
stopped and its folder deleted at the end.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

USER = "cglib"


def postgres_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb, or None."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    found.sort(key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def why_no_postgres() -> str | None:
    """Why a server cannot start here (for a skip), or None."""
    if postgres_bindir() is None:
        return ("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: `apt-get install postgresql` "
                "(.ci/run does it in CI)")
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _server_user() -> str | None:
    """The unprivileged account to run initdb and the server as when we are root; None when we are not."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a `postgres` nor a `nobody` account exists to run PostgreSQL")


@contextmanager
def postgres_server() -> Iterator[Callable[[str], str]]:
    """Start a throw-away PostgreSQL server on 127.0.0.1; yields `database(name)`, which creates a database and
    returns 'postgresql://cglib@127.0.0.1:PORT/NAME'."""
    bindir = postgres_bindir()
    assert bindir is not None, why_no_postgres()
    user, group = _server_user(), None
    folder = Path(tempfile.mkdtemp(prefix="cglib-postgres-"))
    if user is not None:
        account = pwd.getpwnam(user)
        group = account.pw_gid
        os.chown(folder, account.pw_uid, group)
    data, log, port = folder / "data", folder / "server.log", _free_port()

    def run(*command: str | Path) -> None:
        done = subprocess.run([str(c) for c in command], user=user, group=group, extra_groups=[] if user else None,
                              cwd=folder, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                              check=False)
        if done.returncode:
            server_log = log.read_text()[-2000:] if log.is_file() else ""
            raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr[-2000:]}"
                               f"{server_log}")

    run(bindir / "initdb", "-D", data, "-U", USER, "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
    # fsync off: a test database need not survive a power cut; the socket lives in our folder, not /run/postgresql
    run(bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o",
        f"-p {port} -c listen_addresses=127.0.0.1 -k {folder} -c fsync=off", "start")

    def database(name: str) -> str:
        run(bindir / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", USER, name)
        return f"postgresql://{USER}@127.0.0.1:{port}/{name}"

    try:
        yield database
    finally:
        run(bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
