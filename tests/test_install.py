"""Installable: a built wheel holds the package data the library reads (the corpus, the notebooks,
the committed calibrations) as files, and, installed into a fresh venv, trains the tiny preset from
another directory; a checkout made without symlinks reads the shipped corpus.

The fresh venv gets seamkit only from the wheel; its dependencies (torch and the rest) come from
this interpreter's site-packages through a .pth file, so the test downloads nothing. A .pth
line only appends a directory to sys.path (the editable install's own .pth files there are not
run), so `import seamkit` can only find the wheel's copy.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _run(cmd, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}: {out.stderr[-2000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"  # a clean copy: no build/ or egg-info left in the checkout, none stale read from it
    src.mkdir()
    # seamkit/corpora and seamkit/notebooks hold links into data/ and notebooks/: the wheel stores their targets
    for name in ("pyproject.toml", "README.md", "seamkit", "data", "notebooks"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name, **({"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")}
                                          if copy is shutil.copytree else {}))
    try:
        import setuptools  # noqa: F401 -- present: build without an isolated environment (no download)
        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []
    _run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "-q", *isolation, "-w", out], cwd=out)
    return next(out.glob("seamkit-*.whl"))


def test_wheel_holds_the_package_data(wheel):
    """What seamkit/ links to in a checkout (notebooks/, data/) travels in the wheel as the files
    themselves, beside the committed calibrations.

    Planted fault this catches: a package-data pattern that misses a file (pyproject.toml's
    [tool.setuptools.package-data]), or a link stored as a link."""
    with zipfile.ZipFile(wheel) as z:
        for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
            assert z.read(f"seamkit/notebooks/{nb.name}") == nb.read_bytes(), nb.name
        assert z.read("seamkit/corpora/wordnet.jsonl.gz") == (ROOT / "data" / "wordnet.jsonl.gz").read_bytes()
        assert json.loads(z.read("seamkit/calibrations.json")) == json.loads((ROOT / "seamkit" /
                                                                             "calibrations.json").read_text())


def test_wheel_installs_and_trains_from_another_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip())
    (site / "_seamkit_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import seamkit, seamkit.data.documents as d, seamkit.reproduce as r, seamkit.seams.calibration as k; "
            "print(seamkit.__file__); print(d.SHIPPED['wordnet']); print(r.NOTEBOOKS / r.SEAMS_NB); print(k.COMMITTED)")
    where = _run([py, "-c", code], cwd=elsewhere).split()
    assert all(Path(p).is_relative_to(site / "seamkit") and Path(p).is_file() for p in where), where
    _run([venv / "bin" / "seamkit", "train", "--preset", "tiny", "--max-steps", "2", "--threads", "1",
          "--out", "run"], cwd=elsewhere)
    summary = json.loads((elsewhere / "run" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"] == 2
    assert summary["run_config"]["data"]["corpus"] == "wordnet"


def test_checkout_without_symlinks_reads_the_shipped_corpus(tmp_path):
    """`git -c core.symlinks=false clone` writes seamkit/corpora/wordnet.jsonl.gz, a tracked link, as a
    text file holding the link's target; seamkit imported from that clone still reads the corpus.

    The clone holds the committed tree; the checkout's other files (edits and new files git does not
    ignore) are copied over it, so the code under test is this checkout's, and every link stays as
    git wrote it.
    """
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "clone"
    _run(["git", "-c", "core.symlinks=false", "clone", "-q", ROOT, clone], cwd=tmp_path)
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "seamkit"], cwd=ROOT)
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    link = clone / "seamkit" / "corpora" / "wordnet.jsonl.gz"
    assert not link.is_symlink() and link.read_text().strip() == "../../data/wordnet.jsonl.gz"

    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PYTHONPATH": str(clone)}
    code = ("import seamkit, seamkit.data.documents as d; print(seamkit.__file__); print(d.SHIPPED['wordnet']); "
            "print(next(d.iter_documents(d.SHIPPED['wordnet']))[0])")
    out = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    package, shipped, first = out.stdout.splitlines()
    assert Path(package) == clone / "seamkit" / "__init__.py"
    assert Path(shipped) == (clone / "data" / "wordnet.jsonl.gz").resolve()
    assert first.startswith("entity: that which is perceived")


def torch_versions(root: Path = ROOT) -> dict[str, str]:
    """The torch version each install recipe asks for: the Makefile's pin, pyproject's lower
    bound, environment.yml's conda pin."""
    import re
    found = {
        "Makefile": re.search(r"^TORCH_SPEC \?= torch==([\d.]+)$", (root / "Makefile").read_text(), re.M),
        "pyproject.toml": re.search(r'"torch>=([\d.]+)"', (root / "pyproject.toml").read_text()),
        "environment.yml": re.search(r"^\s*- pytorch=([\d.]+)\s*$", (root / "environment.yml").read_text(), re.M),
    }
    return {name: m.group(1) if m else "none" for name, m in found.items()}


def test_the_three_install_recipes_ask_for_one_torch(tmp_path):
    """The Makefile, pyproject.toml and environment.yml name the same torch (major.minor), the one
    this suite runs on. Planted fault this catches: environment.yml back at `pytorch>=2.4`."""
    import torch
    minor = lambda v: ".".join(v.split(".")[:2])  # noqa: E731
    got = torch_versions()
    assert {minor(v) for v in got.values()} == {minor(torch.__version__.split("+")[0])}, got
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "environment.yml").write_text((ROOT / "environment.yml").read_text().replace("pytorch=2.13", "pytorch>=2.4"))
    assert torch_versions(tmp_path)["environment.yml"] == "none"
