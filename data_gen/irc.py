"""python -m data_gen.irc input=../shared/data/irc out_dir=outputs/data/irc [splits=[train,dev]]

Ubuntu IRC reply structure (Kummerfeld et al., ACL 2019; CC-BY-4.0) as supervision in this toolkit's
formats, one folder per split:
- `conversations`: each file in the common conversation schema (arbor_train/conversations/schema.py): one session,
  one turn per line with its speaker (`turn_id` = the line number; system lines have speaker "system"
  and `meta.system_lines` lists them), `meta.parents` the gold reply-to links;
- `routing`: the reranker's training format. Each annotated message is replayed online through the
  runtime (lines 0-999 are context, committed like the rest): the candidates are what
  `ArborMemory.localize` recalls at that moment (the gold parent added, `recalled` false, when recall
  missed it), `gold_parent` the annotated parent's line (-1: the message starts a conversation),
  `gold_states` every annotated parent. The replay is teacher-forced: each message is committed below
  its first gold parent (a context line with no link attaches where the runtime routes it), so later
  candidates come from the true forest. `teacher_forcing` below 1 commits that share of annotated
  messages at their gold parent and the rest where the runtime routed them (seeded per file): at run
  time the forest is the router's own, with its errors, and features read from it (whose conversation
  a candidate is in, whom it replies to) should be learned from a forest like that. The labels stay
  gold either way. System lines are neither committed nor labelled.
A dataset card with counts goes beside them. Malformed lines and links that point forward or outside
their file fail naming the file and line (arbor_train/conversations/irc.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, MissingInputError, OutputExistsError, entry_point, parse_bool, parse_int
from arbor_train.paths import CONF_DIR


def conversation_row(f) -> dict:
    from arbor_train.conversations.schema import Conversation, Session, Turn

    turns = [Turn(turn_id=str(m.line), speaker="system" if m.system else (m.speaker or "unknown"), text=m.text)
             for m in f.messages]
    conv = Conversation(conversation_id=f.name, speakers=sorted({m.speaker for m in f.messages if m.speaker}),
                        sessions=[Session(session_id=f"{f.name}:0", date_time=f.name[:10], turns=turns)],
                        meta={"system_lines": [m.line for m in f.messages if m.system],
                              "parents": {str(c): sorted(ps) for c, ps in sorted(f.parents.items())}})
    return {"conversation_id": f.name, "document": json.dumps(conv.to_json(), sort_keys=True)}


def routing_rows(f, runtime_cfg: dict, comps: dict, counts: Counter, teacher_forcing: float = 1.0,
                 seed: int = 0) -> list[dict]:
    """The file's annotated messages as routing rows: the generic replay (data_gen/conversations.py) over its
    non-system lines, each turn numbered by its line, the annotation's links as gold parents."""
    from arbor_train.conversations.irc import message_text
    from data_gen.replay import replay_routing

    turns = [{"turn": m.line, "user": message_text(m), "assistant": "", "timestamp": m.time, "speaker": m.speaker,
              "parents": tuple(f.parents[m.line]) if m.line in f.parents else None}
             for m in f.messages if not m.system]
    return replay_routing(f.name, turns, runtime_cfg, comps, counts, teacher_forcing, seed, "irc_annotation")


def card(stats: dict, source: str) -> str:
    lines = ["# Ubuntu IRC reply structure: routing supervision", "",
             f"Source: {source} (Kummerfeld et al., ACL 2019, \"A Large-Scale Corpus for Conversation "
             "Disentanglement\"; CC-BY-4.0). Converted by `python -m data_gen.irc`.", "",
             "| split | files | lines | annotated | new conversations | several parents | gold recalled |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for split, s in stats["splits"].items():
        lines.append(f"| {split} | {s['files']} | {s['lines']:,} | {s['messages']:,} | {s['new_conversation']:,} | "
                     f"{s['multi_parent']:,} | {s['gold_recalled'] / max(1, s['messages']):.3f} |")
    lines += ["", "`gold recalled`: the share of annotated messages whose gold parent was among the runtime's "
              f"recalled candidates (runtime `{stats['runtime']}`"
              + (f", settings `{' '.join(stats['runtime_settings'])}`" if stats.get("runtime_settings") else "")
              + "), or that start a conversation."]
    if stats.get("teacher_forcing", 1.0) < 1.0:
        for split, s in stats["splits"].items():
            lines.append(f"\nReplay ({split}): teacher_forcing {stats['teacher_forcing']} (seed {stats['seed']}): "
                         f"{s['runtime_placed']:,} annotated messages committed where the runtime routed them, "
                         f"{s['runtime_placed_right'] / max(1, s['runtime_placed']):.3f} of those at a gold parent; "
                         "the rest at their gold parent.")
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet

    with quiet():
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    from tqdm import tqdm

    from arbor_train.conversations.io import write_sets
    from arbor_train.conversations.irc import load_irc
    from arbor_train.runtime import build_components
    from arbor_train.runtime.config import label as runtime_label
    from arbor_train.runtime.config import runtime_config
    from arbor_train.runtime.config import settings as runtime_settings

    if OmegaConf.is_missing(cfg, "input") or not cfg.input:
        raise ConfigError("option input (the folder holding train/ and dev/) is required, e.g. input=../shared/data/irc")
    src = Path(str(cfg.input))
    if not src.is_dir():
        raise MissingInputError(f"option input={str(src)!r}: no such folder")
    if isinstance(cfg.splits, str) or not cfg.splits:
        raise ConfigError(f"option splits must be a non-empty list of split folders, got {cfg.splits!r}")
    splits = [str(s) for s in cfg.splits]
    for s in splits:
        if not (src / s).is_dir():
            raise MissingInputError(f"option splits: {src / s} is not a folder")
    overwrite, progress = parse_bool(cfg.overwrite, "overwrite"), parse_bool(cfg.progress, "progress")
    max_files = None if cfg.max_files is None else parse_int(cfg.max_files, "max_files", minimum=1)
    from data_gen.conversations import replay_options

    forcing, seed = replay_options(cfg)
    out = Path(str(cfg.out_dir))
    if out.exists() and not overwrite:  # fail before any work
        raise OutputExistsError(f"out_dir={str(out)!r} already exists; pass overwrite=true to replace it")
    files = {s: load_irc(src / s)[:max_files] for s in splits}  # every file parsed before anything is written
    runtime_cfg = runtime_config(OmegaConf.to_container(cfg, resolve=True))
    comps = build_components(runtime_cfg)
    stats: dict = {"runtime": runtime_label(runtime_cfg), "runtime_settings": runtime_settings(runtime_cfg),
                   "teacher_forcing": forcing, "seed": seed, "splits": {}}
    for split, fs in files.items():
        counts: Counter = Counter()
        rows = {"conversations": [conversation_row(f) for f in fs], "routing": []}
        for f in tqdm(fs, desc=f"irc {split}", unit="file", disable=not progress):
            rows["routing"] += routing_rows(f, runtime_cfg, comps, counts, forcing, seed)
        s = {"files": len(fs), "lines": sum(len(f.messages) for f in fs), **{k: counts[k] for k in (
            "messages", "new_conversation", "multi_parent", "gold_recalled", "runtime_placed",
            "runtime_placed_right")}}
        stats["splits"][split] = s
        write_sets(out / split, rows, s, card({**stats, "splits": {split: s}},
                                                str(src / split)), overwrite)
    (out / "README.md").write_text(card(stats, str(src)))
    print(card(stats, str(src)))
    return stats


@hydra.main(config_path=str(CONF_DIR), config_name="irc", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
