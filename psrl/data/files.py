"""Read prompt tables from disk with the `datasets` library: jsonl / json / parquet files and local
Hugging Face datasets directories (written by `Dataset.save_to_disk`).

Every problem is a `DataError` naming the file and the fix, so the launcher can refuse a dataset
before any actor starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psrl.errors import PsrlError

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataError(PsrlError):
    """A dataset file is missing, unreadable or lacks a column the run needs."""


def read_table(paths: Sequence[str | Path]) -> Any:
    """All rows of `paths`, in order, as one `datasets.Dataset` (memory-mapped Arrow, not loaded in RAM)."""
    import datasets

    if not paths:
        raise DataError("no dataset files given")
    parts = [_read_one(Path(p)) for p in paths]
    if len(parts) == 1:
        return parts[0]
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError as exc:
        raise DataError(f"{', '.join(map(str, paths))}: the files have different columns ({exc})") from exc


def _read_one(path: Path) -> Any:
    import datasets

    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir():
        return _read_saved(path)
    builder = FILE_FORMATS.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path}: unknown format {path.suffix!r}; use .jsonl, .json, .parquet or a datasets directory")
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # the builders raise many types (ArrowInvalid, JSONDecodeError, DatasetGenerationError)
        raise DataError(f"{path}: cannot be read as {builder} ({type(exc).__name__}: {_first_line(exc)})") from exc
    if len(table) == 0:
        raise DataError(f"{path}: has no rows")
    return table


def _read_saved(path: Path) -> Any:
    import datasets

    try:
        saved = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DataError(f"{path}: not a datasets directory written by save_to_disk ({_first_line(exc)})") from exc
    if isinstance(saved, datasets.DatasetDict):
        if len(saved) != 1:
            raise DataError(f"{path}: holds the splits {sorted(saved)}; give the split's directory, e.g. {path}/train")
        saved = next(iter(saved.values()))
    if len(saved) == 0:
        raise DataError(f"{path}: has no rows")
    return saved


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
