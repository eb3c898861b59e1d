"""pytest-xdist's load-scope scheduling with groups of files as scopes (tests/conftest.py names the groups).

xdist's own `--dist loadgroup` reads `xdist_group` marks by rewriting a test's node id, which pytest 9 no longer
lets a plugin do; a scope computed from the node id here works with any pytest."""

from __future__ import annotations

from collections.abc import Callable

from xdist.scheduler import LoadScopeScheduling


class GroupScheduler:
    """A pytest plugin: under `--dist loadscope`, a worker receives every test of a group at once."""

    def __init__(self, group_of: Callable[[str], str]) -> None:
        self.group_of = group_of

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadscope":
            return None  # another --dist mode: xdist's own scheduler
        group_of = self.group_of

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return group_of(nodeid)

        return Scheduling(config, log)
