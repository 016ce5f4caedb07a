"""Writing supervision sets: one folder, never half-written, byte-identical for identical rows.

    out_dir/hf/        datasets.DatasetDict (load_from_disk), one Dataset per set
    out_dir/parquet/   <set>.parquet
    out_dir/jsonl/     <set>.jsonl (sorted keys; the Arrow and Parquet copies are built from it)
    out_dir/stats.json
    out_dir/README.md  the dataset card
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path


def write_sets(out_dir: Path, rows: dict[str, list[dict]], stats: dict, card_text: str, overwrite: bool) -> None:
    """Validate rows against data_gen/schema.py, write everything to a temporary sibling folder, then
    move it into place; an existing out_dir is kept unless overwrite is true."""
    from datasets import Dataset, DatasetDict
    from datasets.utils.logging import disable_progress_bar

    from data_gen.schema import SCHEMAS, validate_rows

    disable_progress_bar()
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"out_dir={str(out_dir)!r} already exists; pass overwrite=true to replace it")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "jsonl").mkdir(parents=True)
    (tmp / "parquet").mkdir()
    try:
        dd = {}
        for name, data in rows.items():
            validate_rows(name, data[:200])
            jsonl = tmp / "jsonl" / f"{name}.jsonl"
            with open(jsonl, "w", encoding="utf-8") as f:
                for row in data:
                    f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            # built from the JSONL mirror, so merged shards and a single run give identical files
            ds = Dataset.from_list([json.loads(line) for line in jsonl.open(encoding="utf-8")],
                                   features=SCHEMAS[name])
            ds._fingerprint = hashlib.sha256(jsonl.read_bytes()).hexdigest()[:16]
            ds.to_parquet(str(tmp / "parquet" / f"{name}.parquet"))
            dd[name] = ds
        DatasetDict(dd).save_to_disk(str(tmp / "hf"))
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(card_text)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
