"""The corpus both studies read: documents, tokenizers, splits, in-memory and token-file corpora,
training rows and held-out windows.

- `corpus`: documents, tokenizers, the deterministic splits, the in-memory corpus and its cache,
  the row loader and the pruning study's windows.
- `tokenfiles`: `seamkit data prepare` and memory-mapped token-file corpora.
"""
