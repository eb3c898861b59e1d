"""pytest-xdist's load-scope scheduling with groups of files as scopes (tests/conftest.py names the groups).

xdist's own `--dist loadgroup` reads `xdist_group` marks by rewriting a test's node id, which pytest 9 no longer
lets a plugin do; a scope computed from the node id here works with any pytest."""

from __future__ import annotations

from collections.abc import Callable

from xdist.scheduler import LoadScopeScheduling


class GroupScopeScheduling(LoadScopeScheduling):
    """Load-scope scheduling whose scope is `group_of(nodeid)`: a worker receives every test of a group at once."""

    def __init__(self, config, log, group_of: Callable[[str], str]) -> None:
        super().__init__(config, log)
        self.group_of = group_of

    def _split_scope(self, nodeid: str) -> str:
        return self.group_of(nodeid)


class GroupScheduler:
    """A pytest plugin: under `--dist loadscope`, schedules by group (any other --dist mode keeps xdist's own)."""

    def __init__(self, group_of: Callable[[str], str]) -> None:
        self.group_of = group_of

    def pytest_xdist_make_scheduler(self, config, log):
        return GroupScopeScheduling(config, log, self.group_of) if config.getvalue("dist") == "loadscope" else None
