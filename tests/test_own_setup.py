"""A researcher's own setup from the command line, as the README walks it: a `datasets` folder on
disk tokenized with a GPT-2-style tokenizer.json (`data prepare --hf`), the seams study on it with
a SwiGLU block and grouped-query attention, its curves in TensorBoard and its figures as PNGs.
Each step's own cases and errors are tested beside its module; this is the chain."""

import gzip
import json
import shutil

import pytest

from seamkit import cli
from seamkit.figures import find_browser
from tests.conftest import ROOT

datasets = pytest.importorskip("datasets")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

TOKENIZER = f"hf:{ROOT / 'data' / 'tokenizers' / 'wordnet-bpe-2k.json'}"
DOCS = 600  # WordNet glosses: enough for the tiny preset's batches and held-out tokens


def test_own_tokenizer_dataset_and_block_to_tensorboard_and_pngs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with gzip.open(ROOT / "data" / "wordnet.jsonl.gz", "rt") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(DOCS), f)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk("glosses")

    assert cli.main(["data", "prepare", "--hf", "glosses", "--tokenizer", TOKENIZER, "--out", "corpus"]) == 0
    block = {"model.vocab": 2048, "model.mlp": "swiglu", "model.kv_heads": 1, "model.bias": False}
    sets = [a for k, v in {"data.corpus": "corpus", "data.tokenizer": TOKENIZER, **block,
                           "train.log_to": "tensorboard", "seams.devices": 1}.items() for a in ("--set", f"{k}={v}")]
    assert cli.main(["seams", "--preset", "tiny", "--max-steps", "4", "--threads", "1", *sets,
                     "--out", "study/seams.json"]) == 0

    report = json.loads((tmp_path / "study" / "seams.json").read_text())
    assert report["run_config"]["model"]["mlp"] == "swiglu" and report["run_config"]["data"]["corpus"] == "corpus"
    for arm in ("e2e", "local"):
        ea = EventAccumulator(str(tmp_path / "study" / "runs" / "seams" / f"{arm}-seed0"))
        ea.Reload()
        logged = {e.step: e.value for e in ea.Scalars("train/loss")}
        run = report["repeats"][0]["arms"][arm]
        curve = dict(zip(run["loss_curve_steps"], run["loss_curve"]))  # a step spanning two marks is one point
        assert sorted(logged) == sorted(curve) and len(logged) == 4
        assert [logged[s] for s in sorted(logged)] == pytest.approx([curve[s] for s in sorted(curve)], abs=1e-4)
        held = {e.step: e.value for e in ea.Scalars("held_out/loss")}  # marks are logged after the final evaluation
        assert held[run["steps"]] == pytest.approx(report["arms"][arm]["final_loss"], abs=1e-4)

    if find_browser() is None:
        pytest.skip("no Chromium here for the PNG step (tests/test_figures.py covers its error)")
    assert cli.main(["figures", "study/seams.json", "--format", "png"]) == 0
    pngs = sorted((tmp_path / "study" / "figures").glob("seams_*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    shutil.rmtree(tmp_path / "study")
