"""seams.resume.check_config: a run saved before a field existed resumes under that field's
default, and a run on an hf: tokenizer does not resume once its tokenizer.json has changed."""

import json
import shutil

import pytest

from seamkit import config as C
from seamkit.seams import resume as R
from tests.conftest import ROOT

TOKENIZER = ROOT / "data" / "tokenizers" / "wordnet-bpe-2k.json"
# fields added after the first saves: each one's default is how those runs trained
ADDED = {"model": ["mlp", "mlp_hidden", "kv_heads", "bias"], "train": ["optimizer", "muon_lr", "log_to"],
         "seams": ["lr_delay_steps", "weight_prediction", "prediction_decay", "error_feedback",
                   "nesterov_momentum"]}


def test_a_config_saved_before_fields_existed_resumes_under_their_defaults(tmp_path):
    cfg = C.tiny()
    saved = cfg.to_dict()
    for section, names in ADDED.items():
        for name in names:
            del saved[section][name]
    R.check_config(saved, cfg, tmp_path / "old.json")  # refused before: "it was run with model.mlp=None"
    with pytest.raises(R.ResumeError, match="model.mlp='gelu', this command asks for 'swiglu'"):
        R.check_config(saved, C.override(cfg, {"model.mlp": "swiglu"}), tmp_path / "old.json")


def hf_cfg(path):
    return C.override(C.tiny(), {"data.tokenizer": f"hf:{path}", "model.vocab": 2048})


def test_a_study_does_not_resume_under_an_edited_tokenizer_file(tmp_path):
    tok = tmp_path / "tokenizer.json"
    shutil.copy(TOKENIZER, tok)
    out = tmp_path / "s.json"
    R.save_study(out, hf_cfg(tok), runs=[])
    assert R.load_study(out, hf_cfg(tok)) == []  # the same file resumes
    doc = json.loads(tok.read_text())
    merges = doc["model"]["merges"]
    merges[0], merges[-1] = merges[-1], merges[0]
    tok.write_text(json.dumps(doc))  # same name, same vocabulary, other merges: other ids for the same text
    with pytest.raises(R.ResumeError, match=r"tokenizer file of data.tokenizer=hf:.* has changed since the run"):
        R.load_study(out, hf_cfg(tok))
