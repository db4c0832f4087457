"""Rebuild data/wordnet.jsonl.gz from the WordNet 3.0 database files.

One document per synset, `lemma: gloss`, in the order of data.noun, data.verb, data.adj and
data.adv (file order = synset offset order). `lemma` is the synset's first word with
underscores turned to spaces and an adjective's syntactic marker ("(a)", "(p)", "(ip)")
dropped; `gloss` is everything after the `|`, quoted examples included.

The output is byte-identical on every run: gzip with mtime=0 and no file name in the header.

    apt-get download wordnet-base && dpkg -x wordnet-base_*.deb x
    python data/prepare_wordnet.py x/usr/share/wordnet
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
from pathlib import Path

POS_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
MARKER = re.compile(r"\((a|p|ip)\)$")  # adjective syntactic markers (wninput(5WN))
OUT = Path(__file__).resolve().parent / "wordnet.jsonl.gz"


def synset_documents(path: Path) -> list[str]:
    docs = []
    for n, line in enumerate(path.read_text(encoding="ascii").splitlines(), 1):
        if line.startswith("  "):  # the license header: two spaces and a line number
            continue
        fields, sep, gloss = line.partition(" | ")
        parts = fields.split()
        if not sep or len(parts) < 5:
            raise SystemExit(f"{path}:{n}: not a wndb synset line")
        lemma = MARKER.sub("", parts[4]).replace("_", " ")
        gloss = gloss.strip()
        if not gloss:
            raise SystemExit(f"{path}:{n}: empty gloss")
        docs.append(f"{lemma}: {gloss}")
    return docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wordnet_dir", type=Path, help="directory holding data.noun, data.verb, data.adj, data.adv")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    lines = []
    for name in POS_FILES:
        docs = synset_documents(args.wordnet_dir / name)
        print(f"{name}: {len(docs)} synsets")
        lines += [json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs]
    raw = "".join(lines).encode("utf-8")

    buf = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header free of anything run-dependent
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(raw)
    args.out.write_bytes(buf.getvalue())
    print(f"{args.out}: {len(lines)} documents, {len(raw) / 1e6:.2f} MB raw, {len(buf.getvalue()) / 1e6:.2f} MB gzip")


if __name__ == "__main__":
    main()
