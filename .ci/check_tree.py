"""A fresh clone must not depend on the machine that made it.

Fails (exit 1, one line per problem) when a tracked symbolic link points outside the repository
or at nothing, or when tracked text names an absolute path of a machine: a home or work folder
(/home/..., /root/..., /Users/..., /work/..., /tmp/..., /mnt/..., /opt/...), this checkout's own
folder or the user's home. System paths every machine has (/proc, /dev, /usr/bin/env) are fine.

    python3 .ci/check_tree.py [REPO]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SELF = ".ci/check_tree.py"
MACHINE_ROOTS = ("/home/", "/root/", "/Users/", "/work/", "/tmp/", "/mnt/", "/opt/", "/private/var/")
# an absolute path starts a token: not inside a URL (https://x/home/...) or a relative path (a/tmp/b)
PATH_START = r"(?<![\w.:/~-])"


def tracked(repo: Path) -> list[tuple[str, str]]:
    """(mode, path) of every file git tracks."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-s", "-z"], capture_output=True, check=True).stdout
    rows = []
    for entry in out.decode().split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            rows.append((meta.split()[0], path))
    return rows


def link_problems(repo: Path, path: str) -> str | None:
    root = repo.resolve()
    target = os.readlink(repo / path)
    where = (repo / path).parent / target
    resolved = Path(os.path.normpath(where if not os.path.isabs(target) else target))
    if not (resolved == root or root in resolved.parents):
        return f"{path} -> {target}: a tracked link that points outside the repository"
    if not (repo / path).exists():
        return f"{path} -> {target}: a tracked link that points at nothing"
    return None


def text_problems(repo: Path, path: str, pattern: re.Pattern) -> list[str]:
    data = (repo / path).read_bytes()
    if b"\0" in data[:8192]:  # binary
        return []
    text = data.decode("utf-8", errors="replace")
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        m = pattern.search(line)
        if m:
            found.append(f"{path}:{n}: names a machine path ({m.group(0)[:60]})")
    return found


def problems(repo: Path) -> list[str]:
    repo = Path(repo)
    roots = set(MACHINE_ROOTS) | {str(repo.resolve()) + "/", str(Path.home()) + "/"}
    pattern = re.compile(PATH_START + "(?:" + "|".join(re.escape(r) for r in sorted(roots)) + r")[^\s\"'`)]*")
    out = []
    for mode, path in tracked(repo):
        if path == SELF:  # names the roots it looks for
            continue
        if mode == "120000":
            p = link_problems(repo, path)
            if p:
                out.append(p)
        elif mode != "160000" and (repo / path).is_file():
            out += text_problems(repo, path, pattern)
    return out


def main(argv: list[str]) -> int:
    repo = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    found = problems(repo)
    for line in found:
        print(f"check_tree: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
