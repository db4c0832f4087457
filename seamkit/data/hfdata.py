"""`seamkit data prepare --hf PATH[:SPLIT]`: the documents of a Hugging Face `datasets` dataset on
disk, streamed row by row into the writer corpus files go through (seamkit.data.prepare).

PATH is a folder `save_to_disk` wrote, read with `datasets.load_from_disk` (memory-mapped Arrow,
nothing copied): a Dataset, or a DatasetDict whose split SPLIT is read (default "train"). Any
other folder is one of .parquet or .arrow files, read with `datasets.load_dataset(..., streaming=True)`,
its splits told by the files' names as the Hub tells them (train-00000-of-00002.parquet,
test/...). The text is the `text_column` column, or else the column named "text", else
"content", else the only string column; rows whose text is null are skipped.

`datasets` is imported here alone, and only for --hf. Its cache (for a streamed folder, lock
files) goes to a temporary folder removed afterwards, never to ~/.cache/huggingface.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from seamkit.data.documents import Source
from seamkit.data.errors import DataError

__all__ = ["NEEDS", "open_dataset"]

NEEDS = "data prepare --hf needs the datasets package: pip install 'seamkit[hf]'"
BATCH_ROWS = 1024  # rows read at a time
KINDS = ("parquet", "arrow")  # the files a folder that save_to_disk did not write may hold


@contextlib.contextmanager
def open_dataset(spec: str, text_column: str | None = None):
    """(Source of the documents, the text column) of `spec`, "PATH[:SPLIT]" (module docstring);
    a DataError in one line, before any row is read, for a missing folder, one that is no
    dataset, no such split, no text column or no rows."""
    try:
        import datasets
    except ImportError:
        raise DataError(NEEDS) from None
    path, split = _parse(spec)
    quiet = not datasets.utils.are_progress_bars_disabled()
    if quiet:  # the one bar is data prepare's
        datasets.utils.disable_progress_bars()
    try:
        with tempfile.TemporaryDirectory(prefix="seamkit-datasets-") as cache:
            ds, label, files = _load(datasets, path, split, cache)
            column = _text_column(datasets, ds, text_column, label)
            rows = ds.num_rows if isinstance(ds, datasets.Dataset) else _parquet_rows(files)
            if rows == 0:
                raise DataError(f"{label}: no documents (0 rows)")
            yield Source(label, rows, "row", lambda: _documents(ds, column, label)), column
    finally:
        if quiet:
            datasets.utils.enable_progress_bars()


def _parse(spec: str) -> tuple[Path, str | None]:
    """PATH and SPLIT of "PATH[:SPLIT]"; a PATH that exists as given holds no split."""
    path = Path(spec).expanduser()
    head, colon, split = spec.rpartition(":")
    if path.exists() or not colon or not head or "/" in split:
        return path, None
    if not split:
        raise DataError(f"--hf {spec}: name a split after ':' or drop the ':'")
    return Path(head).expanduser(), split


def _load(datasets, path: Path, split: str | None, cache: str):
    """The split asked for, as a Dataset (saved) or an IterableDataset (a folder of files), its label,
    and the files of each split of a folder of files ({} for a saved dataset)."""
    if not path.exists():
        raise DataError(f"{path}: no such folder")
    if not path.is_dir():
        raise DataError(f"{path}: not a folder; --hf takes a folder save_to_disk wrote, or one of .parquet or "
                        f".arrow files (give a single file with --corpus)")
    saved = (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
    files = {}
    try:
        if saved:
            ds = datasets.load_from_disk(str(path))
        else:
            kind, files = _data_files(path)
            ds = datasets.load_dataset(kind, data_files=files, streaming=True, cache_dir=cache)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 -- datasets raises many types for a folder it cannot read
        raise DataError(f"{path}: cannot read the dataset ({_first_line(e)})") from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        name = split or "train"
        if name not in ds:
            raise DataError(f"{path}: no split {name!r}; its splits: {', '.join(map(str, ds))} (--hf {path}:SPLIT)")
        return ds[name], f"{path}:{name}", files.get(name, [])
    if split is not None:
        raise DataError(f"{path}: a single dataset, without splits; drop :{split}")
    return ds, str(path), []


def _data_files(path: Path) -> tuple[str, dict[str, list[str]]]:
    """The builder ("parquet" or "arrow") and the files of each split of a folder of data files."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns
    try:
        found = DataFilesDict.from_patterns(get_data_patterns(str(path)), base_path=str(path))
    except EmptyDatasetError:
        found = {}
    files = {kind: {str(s): [f for f in fs if f.endswith(f".{kind}")] for s, fs in found.items()} for kind in KINDS}
    files = {kind: {s: fs for s, fs in splits.items() if fs} for kind, splits in files.items()}
    kinds = [kind for kind in KINDS if files[kind]]
    if not kinds:
        raise DataError(f"{path}: not a dataset: save_to_disk did not write it (no dataset_dict.json or state.json) "
                        f"and it holds no .parquet or .arrow files")
    if len(kinds) > 1:
        raise DataError(f"{path}: holds both .parquet and .arrow files; give a folder of one kind")
    return kinds[0], files[kinds[0]]


def _text_column(datasets, ds, asked: str | None, label: str) -> str:
    features = ds.features or {}
    strings = [c for c, f in features.items()
               if isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")]
    columns = ", ".join(features) or "none known"
    if asked is not None:
        if asked not in strings:
            raise DataError(f"{label}: no string column {asked!r} (columns: {columns})")
        return asked
    for name in ("text", "content"):
        if name in strings:
            return name
    if len(strings) == 1:
        return strings[0]
    if not strings:
        raise DataError(f"{label}: no text column: none of its columns holds strings (columns: {columns})")
    raise DataError(f"{label}: which column is the text? It has string columns {', '.join(strings)}; "
                    f"name one with --text-column")


def _parquet_rows(files: list[str]) -> int | None:
    """Rows of a streamed split: its parquet files' footers say; an .arrow stream's are not known."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if not files or not all(f.endswith(".parquet") for f in files):
        return None
    try:
        return sum(pq.read_metadata(f).num_rows for f in files)
    except (OSError, pa.ArrowException):  # a damaged footer is reported, naming the file, when the rows are read
        return None


def _documents(ds, column: str, label: str):
    """(text, rows read so far) of every row whose text is not null, in order."""
    done = 0
    try:
        for batch in ds.select_columns([column]).iter(batch_size=BATCH_ROWS):
            for text in batch[column]:
                done += 1
                if text is not None:
                    yield text, done
    except Exception as e:  # noqa: BLE001 -- a damaged file, whichever layer of datasets or pyarrow finds it
        raise DataError(f"{label}: cannot read row {done + 1} ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
