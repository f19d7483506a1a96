"""Importers: task sets in public formats turned into Crucible task files.

Each importer (one module per format) reads its format record by record; a bad record is
rejected with its position and reason and the rest still import (records.py). `write_task_set`
then writes the accepted tasks as one JSONL file, atomically.
"""

from __future__ import annotations

from pathlib import Path

from task_sets.importers.harbor import import_harbor
from task_sets.importers.humaneval import import_humaneval
from task_sets.importers.mbpp import import_mbpp
from task_sets.importers.records import SPLITS, Imported, ImportError_, ImportOptions, RecordError, write_task_set
from task_sets.importers.swebench import import_swebench

IMPORTERS = {"humaneval": import_humaneval, "mbpp": import_mbpp, "swebench": import_swebench, "harbor": import_harbor}
WITH_SOURCE_SPLIT = ("mbpp",)  # formats that publish their own train/eval split
FORMATS = tuple(IMPORTERS)
__all__ = ["FORMATS", "SPLITS", "Imported", "ImportError_", "ImportOptions", "RecordError", "import_tasks",
           "write_task_set"]


def import_tasks(fmt: str, path: Path, options: ImportOptions) -> Imported:
    if options.split not in SPLITS:
        raise ImportError_(f"unknown split {options.split!r}; choose one of {', '.join(SPLITS)}")
    if fmt not in IMPORTERS:
        raise ImportError_(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if options.split == "source" and fmt not in WITH_SOURCE_SPLIT:
        raise ImportError_(f"split 'source' takes the format's own split, and {fmt} publishes none; "
                           "choose eval, train or hash")
    return IMPORTERS[fmt](path, options)
