"""The corpus both studies read: documents, tokenizers, splits, in-memory and token-file corpora,
training rows and held-out windows.

Modules, each importing only those above it:
- `errors`: `DataError`, the one exception of the package.
- `tokenizers`: the "qwen" and "bytes" tokenizers and a tokenizer.json's ("hf:PATH", `get_tokenizer`).
- `documents`: which file a corpus name means (the shipped WordNet corpus or a user file), its
  documents streamed from .txt / .jsonl(.gz) / .parquet, and the seed-free train/val/test split.
- `hfdata`: the documents of a Hugging Face `datasets` dataset on disk (`data prepare --hf`).
- `corpus`: `Corpus`, the tokenized arrays of a corpus, and the in-memory one built from a file
  and cached on disk.
- `tokencheck`: what a token directory must hold (meta.json's fields, sizes, checksums,
  consistent arrays), checked whenever one is opened.
- `prepare`: `seamkit data prepare`, corpus files tokenized once into a token directory.
- `tokenfiles`: memory-mapped token-file corpora (a `Corpus`) read from such a directory.
- `load`: `load_corpus`, the corpus a run config names: a file in memory or a token directory.
- `rows`: the seams study's training rows (`RowLoader`, `eval_batches`) and epoch counts.
- `windows`: the pruning study's document-packed windows (`make_windows`).
"""
