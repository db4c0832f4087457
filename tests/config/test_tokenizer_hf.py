"""seamkit.config.sections: data.tokenizer="hf:PATH[#EOD]", a tokenizer.json whose file gives the
vocabulary; every way the file can be wrong is one line, from the config and from the CLI."""

import shutil
import sys
from pathlib import Path

import pytest

from seamkit import cli
from seamkit import config as C

pytest.importorskip("tokenizers")

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "tokenizers" / "wordnet-bpe-2k.json"


def test_vocab_comes_from_the_file():
    """model.vocab must hold the file's 2,047 ids and the pad: 2,048; a smaller one is refused naming it."""
    name = f"hf:{SHIPPED}"
    assert C.tokenizer_vocab(name) == 2048
    assert C.override(C.tiny(), {"data.tokenizer": name, "model.vocab": 2048}).data.tokenizer == name
    with pytest.raises(C.ConfigError, match=r"smaller than the hf:\S+ tokenizer's 2048 ids; --set model.vocab=2048"):
        C.override(C.tiny(), {"data.tokenizer": name})  # the tiny preset's 258 rows (bytes)


def _no_eod(path: Path) -> Path:
    """A valid tokenizer.json holding none of the usual end-of-document tokens."""
    from tokenizers import Tokenizer, models
    Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[])).save(str(path))
    return path


def _broken(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (data.tokenizer, what its one line must say)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "model.json").write_text('{"model": 3}')
    (tmp_path / "latin1.json").write_bytes(b"\xff\xfe{}")
    _no_eod(tmp_path / "noeod.json")
    return {"missing file": (f"hf:{tmp_path / 'none.json'}", "no such file"),
            "folder without tokenizer.json": (f"hf:{tmp_path / 'empty'}", "no tokenizer.json in the folder"),
            "not JSON": (f"hf:{tmp_path / 'bad.json'}", "bad.json is not a tokenizer.json ("),
            "JSON, not a tokenizer": (f"hf:{tmp_path / 'model.json'}", "model.json is not a tokenizer.json ("),
            "not UTF-8": (f"hf:{tmp_path / 'latin1.json'}", "latin1.json is not a tokenizer.json ("),
            "no end-of-document token": (f"hf:{tmp_path / 'noeod.json'}",
                                         "holds none of the end-of-document tokens <|endoftext|> </s>"),
            "named token missing": (f"hf:{SHIPPED}#<eos>", "has no token '<eos>'"),
            "no path": ("hf:", "names no file")}


CASES = ["missing file", "folder without tokenizer.json", "not JSON", "JSON, not a tokenizer", "not UTF-8",
         "no end-of-document token", "named token missing", "no path"]


@pytest.mark.parametrize("case", CASES)
def test_bad_tokenizer_file_is_one_line(tmp_path, case, capsys):
    """From the config: a ConfigError naming the setting; from the CLI: exit 2, that line alone."""
    name, says = _broken(tmp_path)[case]
    with pytest.raises(C.ConfigError) as e:
        C.override(C.tiny(), {"data.tokenizer": name})
    assert str(e.value).startswith(f"data.tokenizer={name}: ") and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert cli.main(["info", "--preset", "tiny", "--set", f"data.tokenizer={name}"]) == 2
    err = capsys.readouterr().err
    assert err == f"seamkit info: error: {e.value}\n"


def test_no_eod_named_explicitly(tmp_path):
    """hf:PATH#TOKEN takes a tokenizer whose end-of-document token has another name."""
    path = _no_eod(tmp_path / "t.json")
    assert C.tokenizer_vocab(f"hf:{path}#b") == 64  # a, b, the pad: to a multiple of 64


def test_the_pad_gets_a_row_of_its_own(tmp_path):
    """64 ids of the file's own: the pad is id 64, so the model needs 128 rows, not 64.
    Planted: rounding the file's ids alone up to a multiple of 64 gives 64 and fails."""
    from tokenizers import Tokenizer, models
    vocab = {"<|endoftext|>": 0, **{chr(97 + i % 26) * (1 + i // 26): 1 + i for i in range(63)}}
    Tokenizer(models.BPE(vocab=vocab, merges=[])).save(str(tmp_path / "t.json"))
    assert C.tokenizer_vocab(f"hf:{tmp_path / 't.json'}") == 128


def test_an_unknown_name_says_what_is_taken():
    with pytest.raises(C.ConfigError, match=r"qwen, bytes or hf:PATH \(a tokenizer.json\), got 'gpt2'"):
        C.DataConfig(tokenizer="gpt2")


def test_missing_tokenizers_package_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "t.json"  # a path not read before, so nothing cached stands in for the package
    shutil.copy(SHIPPED, path)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    with pytest.raises(C.ConfigError) as e:
        C.tokenizer_vocab(f"hf:{path}")
    assert str(e.value) == (f"data.tokenizer=hf:{path}: hf: tokenizers need the tokenizers package: "
                            f"pip install 'seamkit[hf]'")
