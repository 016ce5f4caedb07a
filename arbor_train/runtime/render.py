"""Inspection of a memory forest: JSON export and a picture (matplotlib, Agg; no display needed).

Picture layout: x is the node's position in the conversation (seq, i.e. time) and each root (branch)
gets its own horizontal lane, so interleaved branches show as alternating dots on different lanes.
Parent -> child edges are lines; a fork inside a root opens a sub-row of that root's lane.
"""

from __future__ import annotations

from ..errors import ConfigError

import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .memory import ArborMemory
    from .schema import Node

RENDER_SUFFIXES = (".png", ".svg")
NODE_LABEL_LIMIT = 80  # above this many nodes, per-node id labels are skipped
LANE_LABEL_CHARS = 30


def _short(text: str, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def root_summaries(nodes: list["Node"]) -> list[dict[str, Any]]:
    """One entry per root, in order of first appearance: id, topic key, size, first/last seq."""
    roots: dict[int, dict[str, Any]] = {}
    for n in nodes:  # nodes come in seq order
        r = roots.get(n.root_id)
        if r is None:
            r = roots[n.root_id] = {"id": n.root_id, "topic_key": "", "size": 0, "first_seq": n.seq,
                                    "last_seq": n.seq, "max_depth": 0}
        if n.id == n.root_id:
            r["topic_key"] = n.topic_key
        r["size"] += 1
        r["last_seq"] = max(r["last_seq"], n.seq)
        r["first_seq"] = min(r["first_seq"], n.seq)
        r["max_depth"] = max(r["max_depth"], n.depth)
    return sorted(roots.values(), key=lambda r: r["first_seq"])


def forest_json(mem: "ArborMemory", highlight: list[int] | None = None) -> dict[str, Any]:
    """The forest of mem's conversation, its evidence store, and an optional highlighted path, as JSON."""
    st, conv = mem.store, mem.conv
    nodes = mem.nodes()
    return {
        "conversation_id": conv,
        "counts": mem.stats(),
        "nodes": [n.to_json() for n in nodes],
        "roots": root_summaries(nodes),
        "links": st.links(conv),  # secondary links of multi-intent turns: node -> the other state it continues
        "highlight": [int(i) for i in (highlight or [])],
        "evidence": {
            "facts": [asdict(f) for f in st.facts(conv)],
            "records": [asdict(r) for r in st.records(conv)],
            "artifacts": [asdict(a) for a in st.artifacts(conv, include_superseded=True)],
            "events": [asdict(e) for e in st.events(conv)],
        },
    }


def _check_suffix(out_path: str | Path) -> str:
    suffix = Path(out_path).suffix.lower()
    if suffix not in RENDER_SUFFIXES:
        raise ConfigError(f"out={str(out_path)!r}: a forest picture is written as .png or .svg "
                         f"(got suffix {suffix or 'none'!r})")
    return suffix


def _layout(nodes: list["Node"]) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """y position per node id, and one lane per root (y of its main row, row count, root summary).

    Within a root the first child continues its parent's row; every further child (a fork) opens a new
    row below, so forks do not draw on top of each other.
    """
    roots = root_summaries(nodes)
    by_root: dict[int, list["Node"]] = {}
    for n in nodes:
        by_root.setdefault(n.root_id, []).append(n)
    y: dict[int, float] = {}
    lanes = []
    top = 0.0
    row_gap = 0.45
    for r in roots:
        members = by_root[r["id"]]
        row_of: dict[int, int] = {}
        has_child: set[int] = set()
        rows = 1
        for n in members:  # seq order: parents come before children
            if n.parent_id is None or n.parent_id not in row_of:
                row = 0 if not row_of else rows
                if row_of:
                    rows += 1
            elif n.parent_id not in has_child:
                row = row_of[n.parent_id]
            else:
                row, rows = rows, rows + 1
            if n.parent_id is not None:
                has_child.add(n.parent_id)
            row_of[n.id] = row
            y[n.id] = top + row * row_gap
        lanes.append({"y": top, "rows": rows, "root": r})
        top += (rows - 1) * row_gap + 1.0
    return y, lanes


def render_forest(mem: "ArborMemory", out_path: str | Path, highlight: list[int] | None = None,
                  title: str | None = None) -> str:
    """Draw mem's forest to out_path (.png or .svg); returns the path written."""
    suffix = _check_suffix(out_path)
    import matplotlib
    from matplotlib import patheffects
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    nodes = mem.nodes()
    hl = set(int(i) for i in (highlight or []))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)

    if not nodes:
        fig = Figure(figsize=(6, 3))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.set_title(f"{textwrap.fill(title, 60)}\nempty memory" if title else "empty memory")
        ax.text(0.5, 0.5, f"conversation {mem.conv!r} has no nodes", ha="center", va="center",
                transform=ax.transAxes, color="0.4")
        fig.tight_layout()
        fig.savefig(out, format=suffix[1:], dpi=100)
        return str(out)

    y, lanes = _layout(nodes)
    n_nodes = len(nodes)
    n_rows = sum(l["rows"] for l in lanes)
    seqs = [n.seq for n in nodes]
    span = max(seqs) - min(seqs) + 1
    width = min(32.0, max(7.0, 3.5 + 0.14 * span))
    height = min(24.0, max(2.8, 1.4 + 0.42 * n_rows + 0.12 * len(lanes)))
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    if len(lanes) <= 10:
        palette = list(matplotlib.colormaps["tab10"].colors)
    else:  # tab20, the ten strong colours first, then their light partners
        tab20 = matplotlib.colormaps["tab20"].colors
        palette = list(tab20[0::2]) + list(tab20[1::2])
    colour = {lane["root"]["id"]: palette[i % len(palette)] for i, lane in enumerate(lanes)}
    by_id = {n.id: n for n in nodes}

    dense = n_nodes > 200
    dot = 18 if dense else (34 if n_nodes > NODE_LABEL_LIMIT else 60)
    lw = 0.9 if dense else 1.6
    outline = [patheffects.Stroke(linewidth=lw * 2.6 + 2.0, foreground="black"), patheffects.Normal()]

    # lane guides
    for lane in lanes:
        ax.axhspan(lane["y"] - 0.3, lane["y"] + (lane["rows"] - 1) * 0.45 + 0.3,
                   color=colour[lane["root"]["id"]], alpha=0.06, lw=0)

    # edges parent -> child
    for n in nodes:
        p = by_id.get(n.parent_id) if n.parent_id is not None else None
        if p is None:
            continue
        c = colour[n.root_id]
        xs, ys = [p.seq, n.seq], [y[p.id], y[n.id]]
        if y[p.id] != y[n.id]:  # fork: step down to the sub-row, then run along it
            xs, ys = [p.seq, p.seq + 0.5, n.seq], [y[p.id], y[n.id], y[n.id]]
        if p.id in hl and n.id in hl:
            ax.plot(xs, ys, color=c, lw=lw * 2.6, zorder=3, solid_capstyle="round", path_effects=outline)
        else:
            ax.plot(xs, ys, color=c, lw=lw, alpha=0.85, zorder=2)

    # secondary links (multi-intent turns): dashed, from the linked state to the turn
    for link in mem.store.links(mem.conv):
        a, b = by_id.get(link["target_id"]), by_id.get(link["node_id"])
        if a is not None and b is not None:
            ax.annotate("", xy=(b.seq, y[b.id]), xytext=(a.seq, y[a.id]), zorder=2,
                        arrowprops={"arrowstyle": "->", "linestyle": "--", "color": "0.35", "lw": lw * 0.8,
                                    "connectionstyle": "arc3,rad=0.25"})

    # nodes
    plain = [n for n in nodes if n.id not in hl]
    marked = [n for n in nodes if n.id in hl]
    ax.scatter([n.seq for n in plain], [y[n.id] for n in plain], s=dot, zorder=4,
               c=[colour[n.root_id] for n in plain], edgecolors="white", linewidths=0.6)
    if marked:
        ax.scatter([n.seq for n in marked], [y[n.id] for n in marked], s=dot * 2.2, zorder=5,
                   c=[colour[n.root_id] for n in marked], edgecolors="black", linewidths=1.8)
    roots_marked = [n for n in nodes if n.parent_id is None]
    ax.scatter([n.seq for n in roots_marked], [y[n.id] for n in roots_marked], s=dot * 0.25, zorder=6,
               c="white", linewidths=0)  # hollow centre marks a root

    if n_nodes <= NODE_LABEL_LIMIT:
        fs = 8 if n_nodes <= 40 else 6.5
        for n in nodes:
            ax.annotate(str(n.id), (n.seq, y[n.id]), xytext=(0, 8 if n.id in hl else 6), textcoords="offset points",
                        ha="center", va="bottom", fontsize=fs, zorder=7,
                        fontweight="bold" if n.id in hl else "normal")

    # axes: lanes labelled with the root's topic key
    lane_fs = 9 if len(lanes) <= 20 else (7 if len(lanes) <= 45 else 5)
    ax.set_yticks([lane["y"] for lane in lanes])
    ax.set_yticklabels([f"{_short(lane['root']['topic_key'], LANE_LABEL_CHARS)}  ({lane['root']['size']})"
                        for lane in lanes], fontsize=lane_fs)
    for tick, lane in zip(ax.get_yticklabels(), lanes):
        tick.set_color(colour[lane["root"]["id"]])
    ax.tick_params(axis="y", length=0)
    ymax = lanes[-1]["y"] + (lanes[-1]["rows"] - 1) * 0.45
    ax.set_ylim(ymax + 0.6, -0.6)  # first root at the top
    ax.set_xlim(min(seqs) - 0.8, max(seqs) + 0.8)
    if span <= 25:
        ax.set_xticks(range(min(seqs), max(seqs) + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=20))
    ax.set_xlabel("turn (node seq)")
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    counts = mem.stats()
    default = f"conversation {mem.conv!r}: {_plural(counts['nodes'], 'node')}, {_plural(counts['roots'], 'root')}"
    if counts.get("links"):
        default += f", {_plural(counts['links'], 'secondary link')} (dashed)"
    if hl:
        default += f" (highlighted path: {_plural(len(hl), 'node')})"
    per_line = max(30, int(width * 72 / (11 * 0.62)) - 6)  # characters that fit across the figure
    fig.suptitle(textwrap.fill(title or default, per_line), fontsize=11)
    fig.tight_layout()
    fig.savefig(out, format=suffix[1:], dpi=110)
    return str(out)
