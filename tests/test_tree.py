"""The fresh-clone check `.ci/run` runs first: no tracked link out of the tree or at nothing, no
tracked text naming a machine's path."""

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("check_tree", ROOT / ".ci" / "check_tree.py")
check_tree = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_tree)


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "ok.py").write_text('STAT = "/proc/stat"  # every machine has it\nURL = "https://x.org/home/a"\n')
    (repo / "data.txt").write_text("x\n")
    os.symlink("../data.txt", repo / "pkg" / "inside")  # a link inside the tree: fine
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def _commit(repo):
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)


@pytest.mark.skipif(not os.path.exists("/usr/bin/git") and not os.path.exists("/bin/git"), reason="no git")
def test_planted_links_and_machine_paths_fail_the_check(tmp_path):
    repo = _repo(tmp_path)
    _commit(repo)
    assert check_tree.problems(repo) == []
    os.symlink(str(tmp_path / "venv"), repo / ".venv")  # the link a fresh clone breaks on
    os.symlink("missing.txt", repo / "dangling")
    planted = "/" + "work/main/.cache"  # spelled in parts, so this file does not trip the check itself
    (repo / "pkg" / "paths.py").write_text(f'CACHE = "{planted}"\nHERE = "{repo}/x"\n')
    _commit(repo)
    found = check_tree.problems(repo)
    assert any(".venv ->" in p and "outside the repository" in p for p in found), found
    assert any("dangling ->" in p and "points at nothing" in p for p in found), found
    assert any(p.startswith("pkg/paths.py:1:") for p in found) and any(p.startswith("pkg/paths.py:2:") for p in found)
    assert len(found) == 4, found
    out = subprocess.run([sys.executable, str(ROOT / ".ci" / "check_tree.py"), str(repo)], capture_output=True,
                         text=True)
    assert out.returncode == 1 and out.stderr.count("check_tree: ") == 4


def test_this_repository_passes():
    assert check_tree.problems(ROOT) == []
