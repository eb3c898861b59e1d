"""`make test`'s tiers and parallel workers: `full` is left out of CI; a group of test files runs on one worker
(tests/xdist_groups.py), so the session runs that several files read are made once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import GROUP_OF_FILE, group_of_test

TESTS = Path(__file__).resolve().parent


def test_a_file_is_its_own_group_unless_listed():
    assert group_of_test("tests/test_book.py::test_x[a::b]") == "classroom"
    assert group_of_test("tests/test_browser.py::test_y") == "small_run"
    assert group_of_test("tests/test_train.py::test_z") == "tests/test_train.py"
    assert all((TESTS.parent / file).is_file() for file in GROUP_OF_FILE)  # no stale entry


def test_two_workers_run_a_group_of_files_on_one_worker(tmp_path):
    """Two files in one group and four files of their own, under `-n 2 --dist loadscope`: each test records its
    worker; the grouped files' tests all ran on one worker, and the other files were shared between the two."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from xdist_groups import GroupScheduler

        def pytest_configure(config):
            group = lambda nodeid: "pair" if nodeid.split("::")[0] in ("test_a.py", "test_b.py") else nodeid
            config.pluginmanager.register(GroupScheduler(group), "groups")
        """))
    for name in ["a", "b", "c", "d", "e", "f"]:
        (tmp_path / f"test_{name}.py").write_text(textwrap.dedent(f"""
            import os, time
            def test_{name}_1():
                time.sleep(0.3)
                open("{name}_1.worker", "w").write(os.environ["PYTEST_XDIST_WORKER"])
            def test_{name}_2():
                time.sleep(0.3)
                open("{name}_2.worker", "w").write(os.environ["PYTEST_XDIST_WORKER"])
            """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider",
                             "-q", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    worker = {path.stem: path.read_text() for path in tmp_path.glob("*.worker")}
    assert len(worker) == 12
    assert len({worker[k] for k in ("a_1", "a_2", "b_1", "b_2")}) == 1
    assert len(set(worker.values())) == 2  # the other files went to both workers


def test_make_test_leaves_out_the_full_tier_that_the_book_names():
    """`make test` (CI) deselects the `full` marker and `make test-full` runs everything; the files that mark tests
    `full` are the ones book/tests.md lists for that tier."""
    makefile = (TESTS.parent / "Makefile").read_text()
    assert re.search(r'^test:.*\n\t.*pytest -m "not full"', makefile, flags=re.MULTILINE)
    assert re.search(r"^test-full:.*\n\t.*pytest \$\(PYTEST_WORKERS\)$", makefile, flags=re.MULTILINE)
    marked = {path.name for path in TESTS.glob("test_*.py") if "pytest.mark.full" in path.read_text()
              and path.name != Path(__file__).name}
    tier = (TESTS.parent / "book" / "tests.md").read_text().split("**Two tiers.**")[1].split("\n\n")[0]
    assert marked == {"test_rehearsal_e2e.py", "test_demo_pipeline.py", "test_magic_hf.py"}
    assert all(name in tier for name in marked)
