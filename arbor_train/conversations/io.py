"""Writing supervision sets: streamed, schema-checked, never half-written, byte-identical for identical rows.

    out_dir/hf/        datasets.DatasetDict (load_from_disk), one Dataset per set
    out_dir/parquet/   <set>.parquet
    out_dir/jsonl/     <set>.jsonl (one JSON object per line, sorted keys)
    out_dir/stats.json
    out_dir/README.md  the dataset card

Rows are appended to the JSONL mirrors as they are produced (a 10k-session shard never sits in memory
as Python objects); at the end the Arrow and Parquet copies are built from the JSONL files by pyarrow's
JSON reader with the set's explicit schema, so a merge of shards and a single run give identical files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable


@contextmanager
def quiet(logger_name: str = "arbor_train", level: int = logging.ERROR):
    """Raise a logger's level for a block (replays log every repaired extractor output) and restore it."""
    lg = logging.getLogger(logger_name)
    old = lg.level
    lg.setLevel(level)
    try:
        yield
    finally:
        lg.setLevel(old)


def dumps(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, sort_keys=True)


class SetWriter:
    def __init__(self, out_dir: str | Path, names: Iterable[str], overwrite: bool):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not overwrite:
            from arbor_train.errors import OutputExistsError

            raise OutputExistsError(f"out_dir={str(self.out_dir)!r} already exists; pass overwrite=true to replace it")
        self.tmp = self.out_dir.with_name(self.out_dir.name + ".tmp")
        shutil.rmtree(self.tmp, ignore_errors=True)
        (self.tmp / "jsonl").mkdir(parents=True)
        self.names = list(names)
        self._files = {n: open(self.tmp / "jsonl" / f"{n}.jsonl", "w", encoding="utf-8") for n in self.names}
        self.counts = {n: 0 for n in self.names}
        self._checked = {n: 0 for n in self.names}

    def write(self, name: str, rows: Iterable[dict]) -> None:
        from arbor_train.conversations.supervision import validate_rows

        f = self._files[name]
        for row in rows:
            if self._checked[name] < 200:  # schema-check the head of every set
                validate_rows(name, [row], source=f"{self.out_dir.name}/")
                self._checked[name] += 1
            f.write(dumps(row) + "\n")
            self.counts[name] += 1

    def write_lines(self, name: str, lines: Iterable[str]) -> None:
        """Append already-serialised rows (from worker processes); the head is still schema-checked."""
        f = self._files[name]
        for line in lines:
            if self._checked[name] < 200:
                from arbor_train.conversations.supervision import validate_rows

                validate_rows(name, [json.loads(line)], source=f"{self.out_dir.name}/")
                self._checked[name] += 1
            f.write(line + "\n")
            self.counts[name] += 1

    def abort(self) -> None:
        for f in self._files.values():
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def finish(self, stats: dict, card_text: str) -> Path:
        import pyarrow.json as pj
        import pyarrow.parquet as pq
        from datasets import Dataset, DatasetDict, DatasetInfo
        from datasets.utils.logging import disable_progress_bar

        from arbor_train.conversations.supervision import SCHEMAS

        disable_progress_bar()
        try:
            for f in self._files.values():
                f.close()
            (self.tmp / "parquet").mkdir()
            dd = {}
            for name in self.names:
                jsonl = self.tmp / "jsonl" / f"{name}.jsonl"
                feats = SCHEMAS[name]
                if self.counts[name]:
                    table = pj.read_json(jsonl, parse_options=pj.ParseOptions(
                        explicit_schema=feats.arrow_schema, unexpected_field_behavior="error"),
                        read_options=pj.ReadOptions(block_size=1 << 24))
                    table = table.select(feats.arrow_schema.names).cast(feats.arrow_schema)
                else:
                    table = feats.arrow_schema.empty_table()
                pq.write_table(table, self.tmp / "parquet" / f"{name}.parquet")
                if not self.counts[name]:  # `datasets` cannot load an empty split back: the loader makes it
                    continue               # from the empty JSONL mirror (arbor_train.data.load_sets)
                ds = Dataset(table, info=DatasetInfo(features=feats))
                ds._fingerprint = hashlib.sha256(jsonl.read_bytes()).hexdigest()[:16]
                dd[name] = ds
            DatasetDict(dd).save_to_disk(str(self.tmp / "hf"))
            (self.tmp / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
            (self.tmp / "README.md").write_text(card_text)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        if self.out_dir.exists():
            shutil.rmtree(self.out_dir)
        self.tmp.rename(self.out_dir)
        return self.out_dir


def read_rows(path: str | Path, name: str | None) -> list[dict]:
    """Read a JSONL mirror (<out_dir>/jsonl/<name>.jsonl) back, checked row by row against the set's schema.

    A line that is not JSON, a row that does not fit the schema (a string where a boolean belongs, a null
    text, a lone surrogate) and a repeated id are refused; the error names the file, the line and the field.
    With `name` None the rows are any JSON objects (a recorded distillation's drops, rows with fields of
    their own), each checked to be one. Blank lines hold no row and are skipped.
    """
    from arbor_train.conversations.supervision import ROW_IDS, validate_row
    from arbor_train.errors import InputError, MissingInputError

    p = Path(path)
    if not p.is_file():
        raise MissingInputError(f"{p}: no such file")
    rows: list[dict] = []
    seen: dict = {}
    with open(p, encoding="utf-8", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, 1):
            if not line.isascii():
                try:
                    line.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise InputError(f"{p} line {lineno}: not UTF-8 text (character {e.start})") from e
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{p} line {lineno}: invalid JSON ({e.msg}, column {e.colno})") from e
            if name is None:
                if not isinstance(row, dict):
                    raise InputError(f"{p} line {lineno}: a JSON {type(row).__name__}, not an object")
                rows.append(row)
                continue
            key = ROW_IDS.get(name)
            rid = row.get(key) if isinstance(row, dict) and key else None
            validate_row(name, row, f"{p} line {lineno}" + (f" ({key}={rid!r})" if isinstance(rid, str) else "")
                         + f": {name}")
            if key is not None:
                if row[key] in seen:
                    raise InputError(f"{p}: duplicate {key} {row[key]!r} on lines {seen[row[key]]} and {lineno}")
                seen[row[key]] = lineno
            rows.append(row)
    return rows


def write_sets(out_dir: Path, rows: dict[str, list[dict]], stats: dict, card_text: str, overwrite: bool) -> Path:
    """Write in-memory rows (small sets, e.g. LoCoMo) through the same streaming writer."""
    w = SetWriter(out_dir, list(rows), overwrite)
    try:
        for name, data in rows.items():
            w.write(name, data)
    except BaseException:
        w.abort()
        raise
    return w.finish(stats, card_text)
