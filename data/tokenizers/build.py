"""Build data/tokenizers/wordnet-bpe-2k.json: a GPT-2-style byte-level BPE tokenizer trained on the
shipped WordNet glosses (data/wordnet.jsonl.gz), the tokenizer.json that the tests and the
`--tokenizer hf:PATH` example in docs/data.md use.

Its 2,047 ids are <|endoftext|> (id 0: the end-of-document token seamkit finds by that name), the
256 byte symbols and 1,790 merges learned from the glosses. seamkit adds a pad id past them (2,047),
so a model needs `model.vocab=2048`. Any text encodes, non-ASCII included: byte-level BPE falls
back to single bytes.

Training is deterministic: the trainer breaks ties between pairs of equal count by the pair
itself, so every run writes the same bytes (with the same `tokenizers` version).

    python data/tokenizers/build.py            # needs `pip install 'seamkit[hf]'`
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "wordnet.jsonl.gz"
OUT = HERE / "wordnet-bpe-2k.json"
VOCAB = 2047  # ids in the file; seamkit's pad makes the model's vocabulary 2,048
EOD = "<|endoftext|>"


def documents(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def build(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # GPT-2's: split on its regex, map every byte to a printable symbol, no prefix space
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # all 256 bytes
    tok.train_from_iterator(docs, trainer, length=len(docs))
    return tok


def main() -> None:
    tok = build(documents(CORPUS))
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB and tok.token_to_id(EOD) == 0
    OUT.write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    print(f"{OUT}: {VOCAB} ids, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
