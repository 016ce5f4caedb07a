"""python -m data_gen.conversations input=my_chats.jsonl out_dir=outputs/data/my_chats [heldout=0.25]

Routing supervision from your own conversations, in the conversation file format
(arbor_train/conversations/files.py; docs/reference/conversation_files.md). Each conversation is replayed
online through the runtime: at every labelled turn the candidates are what `ArborMemory.localize` recalls
at that moment, and a routing row records them with the gold parent.

- Gold links: a file where turns carry `parent` is mined with those links (`label_rule: gold_link`). Each
  labelled turn is committed below its first gold parent (teacher forcing; `teacher_forcing` below 1
  keeps that share and commits the rest where the runtime routed them, seeded per conversation), so later
  candidates come from the true forest. A gold parent recall missed is added (`recalled: false`). Turns
  without `parent` are committed unlabelled, as context.
- Weak rules: a file where no turn carries `parent` is labelled by the runtime's own rules: a turn the
  runtime routes by a return cue ("back to the ..."), or whose routing confidence (the softmax over
  trajectories and the new-root option; `weak.min_confidence`) is high enough, gets a row labelled where
  the runtime put it (`label_rule: runtime_<route>`); continuation cues choose the latest turn without
  recalling candidates, so they give no row. Every turn is committed where the runtime routed it. These
  labels are only as good as the runtime's rules: a reranker trained on them learns to agree with them.

`heldout` > 0 keeps that share of the conversations (drawn with `seed`) in `out_dir/heldout`, the rest in
`out_dir/train`; a file with one conversation is split by time instead (its last turns are held out, read
against the forest of all earlier turns). Every miner replays through the same online replay
(data_gen/replay.py: `Replay`, and `replay_routing` for routing rows from gold or weak labels): this one,
Ubuntu IRC (data_gen/irc.py), LoCoMo (data_gen/locomo.py) and BranchMemEval plans (data_gen/branchmem/mine.py).
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, OutputExistsError, entry_point, parse_bool, parse_float, parse_int
from arbor_train.paths import CONF_DIR

def replay_options(cfg: DictConfig) -> tuple[float, int]:
    """`teacher_forcing` (the share of labelled turns committed at their gold parent, in [0, 1]) and `seed`,
    read strictly; shared by the miners that replay gold links (this one and data_gen.irc)."""
    forcing, seed = parse_float(cfg.teacher_forcing, "teacher_forcing", minimum=0.0), parse_int(cfg.seed, "seed")
    if forcing > 1.0:
        raise ConfigError(f"option teacher_forcing is the share of labelled turns committed at their gold parent, "
                          f"between 0 and 1, got {cfg.teacher_forcing!r}")
    return forcing, seed


def from_branchmem(session: dict) -> list[dict]:
    """A BranchMemEval session (python -m data_gen.branchmem) as conversation-file turns, its plan's gold
    parents as `parent` labels: how docs/examples/chats.jsonl was made."""
    return [{"conversation_id": session["session_id"], "id": t["index"], "user": t["user"], "assistant": t["assistant"],
             "timestamp": t["timestamp"], "parent": None if t["gold_parent"] < 0 else t["gold_parent"]}
            for t in session["turns"]]


def numbered(conv) -> list[dict]:
    """A conversation file's turns as replay input: `turn` is the 1-based position, parents likewise."""
    return [dict(t, turn=i + 1, parents=None if t["parents"] is None else tuple(p + 1 for p in t["parents"]))
            for i, t in enumerate(conv.turns)]


def split(convs: list, share: float, seed: int) -> dict[str, list[tuple[object, int, int]]]:
    """split name -> [(conversation, rows from, rows to)]: whole conversations drawn with `seed`, or for a
    single conversation its last `share` of turns (the earlier ones replayed as their context)."""
    if share <= 0:
        return {"train": [(c, 0, len(c.turns)) for c in convs]}
    if len(convs) == 1:
        c = convs[0]
        cut = len(c.turns) - max(1, round(share * len(c.turns)))
        if cut < 1:
            raise ConfigError(f"option heldout={share}: conversation {c.conversation_id!r} has {len(c.turns)} turns, "
                              "too few to hold any out")
        return {"train": [(c, 0, cut)], "heldout": [(c, cut, len(c.turns))]}
    order = sorted(range(len(convs)), key=lambda i: random.Random(zlib.crc32(f"{seed}:{convs[i].conversation_id}".encode())).random())
    n_held = max(1, round(share * len(convs)))
    held = set(order[:n_held])
    if len(held) == len(convs):
        raise ConfigError(f"option heldout={share}: holds out every one of the {len(convs)} conversations")
    return {"train": [(c, 0, len(c.turns)) for i, c in enumerate(convs) if i not in held],
            "heldout": [(c, 0, len(c.turns)) for i, c in enumerate(convs) if i in held]}


def card(stats: dict, source: str) -> str:
    lines = ["# Routing supervision from a conversation file", "",
             f"Source: {source}. Converted by `python -m data_gen.conversations` (labels: {stats['labels']}; "
             f"runtime `{stats['runtime']}`).", "",
             "| split | conversations | turns | rows | new threads | gold recalled |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in stats["splits"].items():
        lines.append(f"| {name} | {s['conversations']} | {s['turns']} | {s['messages']} | {s['new_conversation']} | "
                     f"{s['gold_recalled'] / max(1, s['messages']):.3f} |")
    if stats["labels"] == "weak":
        lines += ["", "Weak labels: only turns the runtime routed by a cue, or with routing confidence of at least "
                  f"{stats['weak_min_confidence']}, got a row; {sum(s['unsure'] for s in stats['splits'].values())} "
                  "turns were left unlabelled."]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet

    with quiet():
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    from tqdm import tqdm

    from arbor_train.conversations.files import load_conversations
    from arbor_train.conversations.io import write_sets
    from arbor_train.runtime import build_components
    from arbor_train.runtime.config import label as runtime_label
    from arbor_train.runtime.config import runtime_config
    from data_gen.replay import replay_routing

    if OmegaConf.is_missing(cfg, "input") or not cfg.input:
        raise ConfigError("option input (a conversation file: docs/reference/conversation_files.md) is required")
    if OmegaConf.is_missing(cfg, "out_dir") or not cfg.out_dir:
        raise ConfigError("option out_dir (the folder the routing rows are written to) is required")
    overwrite, progress = parse_bool(cfg.overwrite, "overwrite"), parse_bool(cfg.progress, "progress")
    share = parse_float(cfg.heldout, "heldout", minimum=0.0)
    if share >= 1.0:
        raise ConfigError(f"option heldout is the share of conversations held out, in [0, 1), got {cfg.heldout!r}")
    forcing, seed = replay_options(cfg)
    weak_conf = parse_float(cfg.weak.min_confidence, "weak.min_confidence", minimum=0.0)
    out = Path(str(cfg.out_dir))
    if out.exists() and not overwrite:  # fail before any work
        raise OutputExistsError(f"out_dir={str(out)!r} already exists; pass overwrite=true to replace it")
    convs = load_conversations(str(cfg.input), dict(cfg.runtime.limits))  # the whole file checked first
    labelled = any(c.labelled for c in convs)
    parts = split(convs, share, seed)
    runtime_cfg = runtime_config(OmegaConf.to_container(cfg, resolve=True))
    comps = build_components(runtime_cfg)
    stats: dict = {"labels": "gold" if labelled else "weak", "runtime": runtime_label(runtime_cfg),
                   "weak_min_confidence": None if labelled else weak_conf, "teacher_forcing": forcing,
                   "heldout": share, "seed": seed, "splits": {}}
    names = list(parts)
    for name in names:
        counts: Counter = Counter()
        rows: list[dict] = []
        for conv, lo, hi in tqdm(parts[name], desc=f"conversations {name}", unit="conversation", disable=not progress):
            turns = numbered(conv)[:hi]
            rows += replay_routing(conv.conversation_id, turns, runtime_cfg, comps, counts, forcing, seed,
                                   "gold_link", None if labelled else weak_conf, rows_from=lo)
            counts["turns"] += hi - lo
        if not rows:
            raise ConfigError(f"input={cfg.input}: the {name} split gave no routing rows"
                              + ("" if labelled else " (no turn was routed surely enough: lower weak.min_confidence)"))
        stats["splits"][name] = {"conversations": len(parts[name]), "turns": counts["turns"], "messages": counts["messages"],
                                 "new_conversation": counts["new_conversation"], "gold_recalled": counts["gold_recalled"],
                                 "unsure": counts["unsure"]}
        write_sets(out / name, {"routing": rows}, dict(stats["splits"][name], source=str(cfg.input), split=name),
                   f"# {name}\n\nRouting rows of {cfg.input} ({name}); see ../README.md.\n", overwrite)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(card(stats, str(cfg.input)))
    print(card(stats, str(cfg.input)))
    return stats


@hydra.main(config_path=str(CONF_DIR), config_name="conversations", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
