"""What a tokenizer name (`data.tokenizer`) means: qwen, bytes, or hf:PATH[#EOD], a tokenizer.json
of one's own, read and checked here (its ids, its end-of-document token, the hash that pins it);
the tokenizers themselves are `seamkit.data.tokenizers`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from seamkit.config.fields import ConfigError

TOKENIZERS = ("qwen", "bytes")  # and "hf:PATH[#EOD]", a tokenizer.json of one's own (`hf_tokenizer`)
HF = "hf:"
# the end-of-document token of a tokenizer.json whose name gives none (hf:PATH#TOKEN): the first of these it holds
EOD_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")
HF_VOCAB_MULTIPLE = 64  # an hf tokenizer's ids and pad, rounded up to a multiple of this (`HFTokenizerFile`)


def check_tokenizer(name: str) -> None:
    """data.tokenizer names a tokenizer: qwen, bytes, or hf:PATH[#EOD] whose file reads (ConfigError)."""
    if name.startswith(HF):
        hf_tokenizer(name)
    elif name not in TOKENIZERS:
        raise ConfigError(f"data.tokenizer must be qwen, bytes or hf:PATH (a tokenizer.json), got {name!r}")


def tokenizer_vocab(name: str) -> int:
    """Ids a tokenizer can emit (the model's vocab must be at least this); an hf: tokenizer's file is read."""
    if name.startswith(HF):
        return hf_tokenizer(name).n_vocab
    return {"qwen": 151936, "bytes": 258}[name]


def tokenizer_sha256(name: str) -> str | None:
    """The SHA-256 of an hf: tokenizer's file, which the name alone does not pin (a file edited
    in place keeps its name); None for the built-in tokenizers. Checkpoints and a study's state
    keep it, so a resume under another file is refused."""
    return hf_tokenizer(name).sha256 if name.startswith(HF) else None


@dataclass(frozen=True)
class HFTokenizerFile:
    """The tokenizer.json that data.tokenizer="hf:PATH[#EOD]" names, as `hf_tokenizer` read it.

    Its ids are the file's own, added tokens included (`n_real`). `pad` is the first id past
    them, so encode never emits it; the model's rows are that many rounded up to a multiple of
    HF_VOCAB_MULTIPLE, as Qwen's 151,851 ids are padded to 151,936: the embedding and LM-head
    matmuls then run on whole GPU tiles, and an id no document holds costs one unused row.
    """
    path: Path
    sha256: str  # of the file's bytes: what token caches and token folders are keyed on
    backend: object  # the tokenizers.Tokenizer, special tokens in text encoded as plain text
    eod_token: str  # appended after every document, by id
    eod: int
    n_real: int  # ids the file defines

    @property
    def pad(self) -> int:
        return self.n_real

    @property
    def n_vocab(self) -> int:
        return -(-(self.n_real + 1) // HF_VOCAB_MULTIPLE) * HF_VOCAB_MULTIPLE


_HF_FILES: dict[tuple, HFTokenizerFile] = {}  # (path, sha256, eod asked for) -> the file parsed once


def hf_tokenizer(name: str) -> HFTokenizerFile:
    """The tokenizer.json "hf:PATH[#EOD]" names: PATH a file or a folder holding tokenizer.json, EOD
    its end-of-document token (default: the first of EOD_NAMES it holds; a PATH holding '#' needs
    one). The bytes are read on every call, so an edited file is never mistaken for the one read
    before; a missing, unreadable or corrupt file is a one-line ConfigError."""
    spec, _, eod = name[len(HF):].rpartition("#") if "#" in name else (name[len(HF):], "", "")
    where = f"data.tokenizer={name}"
    if not spec:
        raise ConfigError(f"{where}: names no file; give hf:path/to/tokenizer.json")
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.exists():
            raise ConfigError(f"{where}: no tokenizer.json in the folder {spec}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path} ({e.strerror or e})") from None
    key = (str(path.absolute()), hashlib.sha256(raw).hexdigest(), eod)
    if key not in _HF_FILES:
        _HF_FILES[key] = _parse_hf(where, path, raw, key[1], eod, spec)
    return _HF_FILES[key]


def _parse_hf(where: str, path: Path, raw: bytes, sha256: str, eod: str, spec: str) -> HFTokenizerFile:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(f"{where}: hf: tokenizers need the tokenizers package: pip install 'seamkit[hf]'") from None
    try:  # from the bytes just hashed, not the path: the digest is of exactly what was parsed
        backend = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 -- the library raises a bare Exception for a file it cannot parse
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{where}: {path} is not a tokenizer.json ({why})") from None
    # The library matches added tokens in the text it encodes, add_special_tokens=False or not; a
    # document's "<|endoftext|>" must stay text, never become the end-of-document id
    backend.encode_special_tokens = True
    names = (eod,) if eod else EOD_NAMES
    found = next(((t, i) for t in names if (i := backend.token_to_id(t)) is not None), None)
    if found is None:
        raise ConfigError(f"{where}: {path} has no token {eod!r}" if eod else
                          f"{where}: {path} holds none of the end-of-document tokens {' '.join(EOD_NAMES)}; "
                          f"name its own: hf:{spec}#TOKEN")
    ids = backend.get_vocab(with_added_tokens=True).values()
    n_real = max(backend.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)  # ids may have gaps
    return HFTokenizerFile(path, sha256, backend, found[0], found[1], n_real)
