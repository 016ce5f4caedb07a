"""Branch-aware reranker role: (input, candidate state) scoring for localization.

- encoder (`task=reranker`): a cross-encoder (encoder + LoRA + one-logit head) over
  (input, `Candidate.document()`) pairs;
- decoder (`task=reranker_llm`): an LLM scorer, logit(yes) - logit(no) at the answer position in the
  Qwen3-Reranker layout.
Both train listwise over a group (gold + hard negatives) plus a learned "new root" logit, so that the
same softmax decides between the candidates and starting a new root; sigmoid(new-root logit) is the
calibrated threshold the bundle hands to the runtime. Baselines: the runtime's no-model heuristic
reranker and the untuned model, on the same held-out groups.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import data as D
from ..errors import ConfigError, parse_int
from ..models import add_lora, build_decoder, build_encoder
from ..prompts import PROMPT_VERSION, RERANK_TEMPLATE
from .common import Built, Role, RoleModule, cap, load_rows, loaders


MIX_FORM = "{dir: PATH, sets: [routing, localization, ...], sessions: null|[ids], exclude_sessions: [ids], max_groups: N}"
QUESTION_DOCUMENTS = ("state", "text")


def group_options(t: dict) -> dict:
    """The task options that shape a group: multi-positive questions and the question document."""
    doc = t.get("question_document", "state")
    if doc not in QUESTION_DOCUMENTS:
        raise ConfigError(f"option task.question_document must be one of {', '.join(QUESTION_DOCUMENTS)}, got {doc!r}")
    return {"multi_positive": bool(t.get("multi_positive", False)), "question_document": doc}


def mix_groups(c: dict) -> tuple[list, list[str]]:
    """Training groups from `data.mix`: extra supervision folders mixed into the training set (for example
    Ubuntu IRC routing rows or LoCoMo question localization beside BranchMemEval), each limited to the
    sessions (conversations) it names or does not exclude; validation stays on the main data. Each
    source's groups are shuffled (seeded) before its cap. Returns the groups and the sorted session ids
    they came from (the bundle's `training_sessions`, checked by eval.run against what it evaluates)."""
    import random

    t, out, used = c["task"], [], set()
    for k, src in enumerate(c["data"].get("mix") or []):
        if not isinstance(src, dict) or not src.get("dir") or not src.get("sets"):
            raise ConfigError(f"option data.mix[{k}] must be {MIX_FORM}, got {src!r}")
        sets = D.load_sets(src["dir"], list(src["sets"]))
        groups, sessions = [], []
        for n in src["sets"]:
            rows = D.of_sessions(sets[n], src.get("sessions"), src.get("exclude_sessions"), f"data.mix[{k}]")
            made = D.rerank_groups(rows, n, t["group_size"], t["include_new_root"], **group_options(t))
            groups += made
            sessions += [str(r["session_id"]) for r in rows]
        if not groups:
            raise ConfigError(f"option data.mix[{k}]: no groups of {list(src['sets'])} in {src['dir']} are left "
                              f"after sessions={src.get('sessions')!r}, exclude_sessions={src.get('exclude_sessions')!r}")
        random.Random(c["seed"] + k).shuffle(groups)
        out += cap(groups, src.get("max_groups"))
        if "sessions" in src or "exclude_sessions" in src:  # a source split by conversation records them
            used |= set(sessions)
    return out, sorted(used)


class PairHead(torch.nn.Module):
    """The head over the runtime's pair features (`task.pair_features`, plus the `task.pair_extra` groups):
    w2 . tanh(W1 [f, l] + b1) + b2 is added to each pair's encoder logit, and wq . q (the input's features)
    to the new-root logit; l, with `task.pair_logit_input`, is the encoder's logit and its gap to the
    group's best (detached: the head reads the text score, it does not train the encoder through it). The
    output layer and wq start at zero, so training starts from the encoder alone. Exported as the
    manifest's `pair_head`; arbor_train.runtime.rerank.PairHead computes the same in numpy."""

    def __init__(self, hidden: int, seed: int, extra: tuple | list = (), logit_input: bool = False):
        from ..runtime.rerank import LOGIT_INPUTS, QUERY_FEATURES, feature_names

        super().__init__()
        self.features, self.logit_input = feature_names(extra), bool(logit_input)
        n_in = len(self.features) + (len(LOGIT_INPUTS) if logit_input else 0)
        g = torch.Generator().manual_seed(seed)
        self.hidden = torch.nn.Linear(n_in, hidden)
        with torch.no_grad():
            self.hidden.weight.copy_(torch.randn(hidden, n_in, generator=g) / n_in ** 0.5)
            self.hidden.bias.zero_()
        self.out = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)
        self.query = torch.nn.Parameter(torch.zeros(len(QUERY_FEATURES)))

    def forward(self, f: torch.Tensor, logit_cols: torch.Tensor | None = None) -> torch.Tensor:
        """f: (pairs, features); logit_cols: (pairs, 2) from `logit_columns`, for a head with logit inputs."""
        if self.logit_input:
            if logit_cols is None:
                raise ValueError("this pair head reads the encoder's logits: pass logit_cols")
            f = torch.cat([f, logit_cols.to(f.dtype)], 1)
        return self.out(torch.tanh(self.hidden(f)))[:, 0]

    @staticmethod
    def logit_columns(logits: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
        """The LOGIT_INPUTS of flattened groups, detached: arbor_train.runtime.rerank.logit_inputs (what the
        runtime computes) of each group's logits."""
        import numpy as np

        from ..runtime.rerank import logit_inputs

        x = logits.detach().float().cpu().numpy()
        cols = [logit_inputs(g) for g in np.split(x, np.cumsum(group_sizes.tolist())[:-1])]
        return torch.from_numpy(np.concatenate(cols)).to(logits.device)

    def to_json(self, root_bias: float) -> dict:
        from ..runtime.rerank import LOGIT_INPUTS, QUERY_FEATURES

        t = lambda x: x.detach().float().cpu().tolist()  # noqa: E731
        out = {"features": self.features, "query_features": QUERY_FEATURES, "w1": t(self.hidden.weight),
               "b1": t(self.hidden.bias), "w2": t(self.out.weight[0]), "b2": float(self.out.bias.detach()),
               "wq": t(self.query), "root_bias": root_bias}
        if self.logit_input:
            out["logit_inputs"] = LOGIT_INPUTS
        return out


REFIT_SETS = ("routing", "localization")


def refit_rows(c: dict) -> list[tuple[str, list[dict], list[int], bool, bool]]:
    """Rows with every recalled candidate, for the pair head's refit (`task.pair_refit`): the main training
    set's rows and each data.mix source's, of the sets `pair_refit.sets` names that the source holds
    (routing: turns; localization: questions asked of the memory, every evidence state a gold), each source
    limited to its sessions as in training (a held-out fold stays out), shuffled (seeded) and capped per
    source and set (`max_rows`). Each is (input, candidates, indices of the gold candidates, whether it
    starts a new root, whether it is a question read with question documents); any state of the gold
    trajectory counts as gold, as in training."""
    import random

    r, t, out = c["task"]["pair_refit"], c["task"], []
    sets = list(r.get("sets") or ["routing"])
    if isinstance(r.get("sets"), str) or any(s not in REFIT_SETS for s in sets):
        raise ConfigError(f"option task.pair_refit.sets must be a list of {', '.join(REFIT_SETS)}, got {r.get('sets')!r}")
    as_question = group_options(t)["question_document"] == "text"
    # the main set always holds routing rows (task.sets may train on its localization rows only)
    sources = [(c["data"]["train_dir"], [*t["sets"], "routing"], None, None, "data.train_dir")]
    sources += [(src["dir"], list(src["sets"]), src.get("sessions"), src.get("exclude_sessions"), f"data.mix[{k}]")
                for k, src in enumerate(c["data"].get("mix") or [])]
    k = 0
    for d, have, sessions, exclude, option in sources:
        for name in [s for s in sets if s in have]:
            rows = D.of_sessions(D.load_sets(d, [name])[name], sessions, exclude, option)
            random.Random(c["seed"] + 100 + k).shuffle(rows)
            k += 1
            kept = []
            for row in rows:
                gold = D.gold_turns(row, name)
                pos = [i for i, x in enumerate(row["candidates"]) if x["turn"] in gold]
                root = name == "routing" and row["gold_parent"] < 0
                if row["candidates"] and (pos or root):  # no candidate: nothing to rank
                    kept.append((row["input"], list(row["candidates"]), pos, root,
                                 name == "localization" and as_question))
            out += cap(kept, r["max_rows"])
    return out


def refit_pair_head(module: "RerankerModule", tokenizer, c: dict) -> dict[str, Any]:
    """Refit the pair head and the new-root logit on whole candidate lists, the encoder frozen.

    Training groups hold the gold and a few of the hardest negatives by the runtime's score, while the
    runtime scores every recalled candidate (24 under the group-chat wide recall): the head never sees
    most of what it must rank below the gold. Here each row's encoder logits are computed once (no
    gradient), then the head is fitted listwise over all candidates plus the new-root option.

    With `val_share`, that share of the rows (seeded) is held out: the listwise loss and acc@1 (the
    gold, or the new-root option, ranked first) are measured on it after every epoch, and the head of
    the best epoch is kept, so a wider head or more epochs cannot overfit the rows unnoticed."""
    import copy

    import numpy as np
    from tqdm import tqdm

    from ..runtime.rerank import LOGIT_INPUTS, encode_pairs, logit_inputs, pair_features

    r, t = c["task"]["pair_refit"], c["task"]
    rows = refit_rows(c)
    if not rows:
        raise ConfigError(f"option task.pair_refit: no {' or '.join(r.get('sets') or ['routing'])} rows with a gold "
                          "candidate to refit the pair head on")
    model, dev = module.model.eval(), module.device
    head, root_logit = module.pair_head, module.new_root_logit
    n, nf = max(len(x[1]) for x in rows), len(head.features)
    feats, qs = np.zeros((len(rows), n, nf), np.float32), []
    enc_l, ys = torch.zeros(len(rows), n + 1), torch.zeros(len(rows), n + 1)
    mask, pairs = torch.zeros(len(rows), n + 1, dtype=torch.bool), 0
    L_ = torch.zeros(len(rows), n, len(LOGIT_INPUTS)) if head.logit_input else None  # padding stays 0
    extra = list(t.get("pair_extra") or [])
    # each row tokenized as at run time (one input against its candidates, truncated as encode_pairs decides);
    # the encoder then reads every row's pairs in batches of similar length, so little of a batch is padding
    encoded: list[tuple[int, int, dict]] = []
    for i, (q, rows_c, pos, root, question) in enumerate(rows):
        cands = [D.candidate_of(x, question) for x in rows_c]
        enc = encode_pairs(tokenizer, [q] * len(cands), [x.document() for x in cands], t["max_length"])
        encoded += [(i, j, {k: v[j] for k, v in enc.items()}) for j in range(len(cands))]
        f, qf = pair_features(q, cands, extra)
        feats[i, : len(cands)] = f
        qs.append(qf)
        mask[i, : len(cands)], mask[i, n] = True, not question  # a question has no new-root option
        ys[i, pos] = 1.0
        ys[i, n] = float(root)
        pairs += len(cands)
    encoded.sort(key=lambda e: len(e[2]["input_ids"]))
    step = parse_int(r.get("logit_batch", 64), "task.pair_refit.logit_batch", minimum=1)
    with torch.no_grad():
        for s in tqdm(range(0, len(encoded), step), desc="pair head refit: encoder logits", unit="batch"):
            part = encoded[s : s + step]
            batch = tokenizer.pad([e[2] for e in part], return_tensors="pt")
            out = model(**{k: v.to(dev) for k, v in batch.items()}).logits[:, 0].float().cpu()
            enc_l[[e[0] for e in part], [e[1] for e in part]] = out
    if L_ is not None:  # each row's logits against its own best candidate
        for i, (_, rows_c, *_) in enumerate(rows):
            L_[i, : len(rows_c)] = torch.from_numpy(logit_inputs(enc_l[i, : len(rows_c)].numpy()))
    F_, Q_ = torch.from_numpy(feats), torch.tensor(qs, dtype=torch.float32)
    params = [*head.parameters(), root_logit]
    opt = torch.optim.Adam(params, lr=float(r["lr"]))
    g = torch.Generator().manual_seed(c["seed"])
    batch = int(r["batch_rows"])

    def logits_of(idx):
        cols = L_[idx].to(dev).view(-1, len(LOGIT_INPUTS)) if L_ is not None else None
        s = enc_l[idx, :n].to(dev) + head(F_[idx].to(dev).view(-1, nf), cols).view(len(idx), n)
        z = torch.cat([s, (root_logit + Q_[idx].to(dev) @ head.query).view(-1, 1)], 1)
        return z.masked_fill(~mask[idx].to(dev), -1e9)

    def loss_of(idx):
        lp = torch.log_softmax(logits_of(idx), 1)
        return -torch.logsumexp(lp.masked_fill(ys[idx].to(dev) == 0, -1e9), 1).mean()

    def acc_of(idx):
        return float((ys[idx].to(dev).gather(1, logits_of(idx).argmax(1, keepdim=True)) > 0).float().mean())

    share = float(r["val_share"] or 0.0)
    if not 0.0 <= share < 1.0:
        raise ConfigError(f"option task.pair_refit.val_share must be in [0, 1), got {r['val_share']!r}")
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(c["seed"] + 7))
    n_val = int(round(share * len(rows)))
    val, fit = (order[:n_val], order[n_val:]) if n_val else (order[:0], torch.arange(len(rows)))
    if share and (n_val == 0 or len(fit) == 0):
        raise ConfigError(f"option task.pair_refit.val_share={share} leaves no rows to fit or to hold out "
                          f"({len(rows)} rows)")
    with torch.no_grad():
        before = float(loss_of(fit))
        val_before = (float(loss_of(val)), acc_of(val)) if n_val else None
    best_val, best_state, best_epoch, epochs = float("inf"), None, 0, int(r["epochs"])
    curve: list[float] = []
    with torch.enable_grad():
        bar = tqdm(range(epochs), desc="pair head refit: fit", unit="epoch")
        for ep in bar:
            for idx in fit[torch.randperm(len(fit), generator=g)].split(batch):
                opt.zero_grad()
                loss = loss_of(idx)
                loss.backward()
                opt.step()
            if n_val:
                with torch.no_grad():
                    v = float(loss_of(val))
                bar.set_postfix(val_loss=round(v, 4))
                curve.append(round(v, 4))
                if v < best_val:
                    best_val, best_epoch = v, ep + 1
                    best_state = (copy.deepcopy(head.state_dict()), root_logit.detach().clone())
    if best_state is not None:
        head.load_state_dict(best_state[0])
        with torch.no_grad():
            root_logit.copy_(best_state[1])
    with torch.no_grad():
        out = {"rows": len(rows), "pairs": pairs, "loss_before": round(before, 4), "loss": round(float(loss_of(fit)), 4)}
        if n_val:
            out.update({"val_rows": n_val, "val_loss_before": round(val_before[0], 4),
                        "val_acc_before": round(val_before[1], 4), "val_loss": round(float(loss_of(val)), 4),
                        "val_acc": round(acc_of(val), 4), "best_epoch": best_epoch, "val_curve": curve})
    return out


class RerankerModule(RoleModule):
    def __init__(self, model, cfg: dict):
        super().__init__(model, cfg)
        self.new_root_logit = torch.nn.Parameter(torch.tensor(float(cfg["task"]["new_root_init"])))
        t = cfg["task"]
        self.pair_head = (PairHead(int(t.get("pair_hidden", 32)), cfg["seed"], list(t.get("pair_extra") or []),
                                   bool(t.get("pair_logit_input", False))) if t.get("pair_features") else None)
        self._val: list[dict] = []

    def param_groups(self) -> list:
        """The pair head learns at `task.pair_lr` (a small MLP over a few features, from zero), the encoder's
        LoRA and the new-root logit at the optimizer's rate."""
        if self.pair_head is None or self.cfg["task"].get("pair_lr") is None:
            return super().param_groups()
        head = {id(p) for p in self.pair_head.parameters()}
        return [{"params": [p for p in self.parameters() if p.requires_grad and id(p) not in head]},
                {"params": list(self.pair_head.parameters()), "lr": float(self.cfg["task"]["pair_lr"])}]

    def scores(self, batch: dict) -> torch.Tensor:
        """One logit per (input, candidate) pair: the head's output for a cross-encoder; for an LLM
        scorer, logit(yes) - logit(no) at the answer position (sigmoid of it is the runtime's p(yes))."""
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if "yes_no" in batch:
            out = self.model(**kwargs, logits_to_keep=1, use_cache=False).logits[:, -1].float()
            yes, no = batch["yes_no"].tolist()
            return out[:, yes] - out[:, no]
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        s = self.model(**kwargs).logits[:, 0].float()
        if self.pair_head is not None:
            cols = PairHead.logit_columns(s, batch["group_sizes"]) if self.pair_head.logit_input else None
            s = s + self.pair_head(batch["features"], cols)
        return s

    def group_logits(self, batch: dict) -> list[torch.Tensor]:
        s = self.scores(batch)
        root = self.new_root_logit.expand(len(batch["group_sizes"]))
        if self.pair_head is not None:
            root = root + batch["query_features"] @ self.pair_head.query
        out, k = [], 0
        for i, n in enumerate(batch["group_sizes"].tolist()):
            out.append(torch.cat([s[k : k + n], root[i].view(1)]))
            k += n
        return out

    def step_loss(self, batch: dict) -> tuple[torch.Tensor, int, list[torch.Tensor]]:
        """Listwise cross-entropy over each group's candidates and its new-root option. A multi-positive
        group (a multi-intent turn) has a soft target: `task.secondary_weight` of the mass on the secondary
        gold, the rest on the primary, so the secondary ranks above the negatives and below the parent.
        A distilled group (teacher scores, data_gen.distill) adds the KL divergence from the teacher's
        distribution, softmax(logit(score) / `task.distill.temperature`) over the candidates and the new-root
        option (its threshold), with weight `task.distill.weight` (the hard loss keeps the rest)."""
        groups = self.group_logits(batch)
        w = float(self.cfg["task"].get("secondary_weight", 0.0))
        dist = self.cfg["task"].get("distill") or {}
        kl_w, temp = float(dist.get("weight", 0.0)), float(dist.get("temperature", 1.0))
        seconds = batch["secondary"].tolist() if "secondary" in batch else [-1] * len(groups)
        manys = batch["golds"].tolist() if "golds" in batch else [[]] * len(groups)
        softs = teacher_targets(batch, temp) if kl_w > 0 and "soft" in batch else [None] * len(groups)
        losses = []
        for logits, gold, sec, many, soft in zip(groups, batch["gold"].tolist(), seconds, manys, softs):
            target = len(logits) - 1 if gold < 0 else gold
            logp = F.log_softmax(logits, 0)
            many = [i for i in many if i >= 0]
            if len(many) > 1:  # a question with several evidence states: the mass on any of them
                hard = -torch.logsumexp(logp[many], 0)
            elif sec >= 0 and w > 0 and gold >= 0:
                hard = -((1 - w) * logp[target] + w * logp[sec])
            else:
                hard = -logp[target]
            if soft is not None:
                hard = (1 - kl_w) * hard + kl_w * (soft * (soft.clamp_min(1e-12).log() - logp)).sum()
            losses.append(hard)
        return torch.stack(losses).mean(), len(groups), groups

    def collect_validation(self, batch: dict, groups: list[torch.Tensor]) -> None:
        for logits, gold in zip(groups, batch["gold"].tolist()):  # each group's own new-root logit
            self._val.append({"scores": logits[:-1].tolist(), "gold": None if gold < 0 else gold,
                              "threshold": float(logits[-1].detach())})

    def epoch_metrics(self) -> dict[str, Any]:
        from ..scoring.training import rerank_metrics

        if not self._val:
            return {}
        m = rerank_metrics(self._val)
        self._val = []
        return m

    @property
    def threshold(self) -> float:
        return float(torch.sigmoid(self.new_root_logit.detach()))


def teacher_targets(batch: dict, temperature: float) -> list[torch.Tensor | None]:
    """Per group, the teacher's distribution over its candidates and the new-root option (None: no teacher
    scores): softmax of logit(score) / temperature, the new-root option at the teacher's threshold."""
    eps = 1e-6
    out: list[torch.Tensor | None] = []
    k = 0
    for i, n in enumerate(batch["group_sizes"].tolist()):
        s = torch.cat([batch["soft"][k : k + n], batch["soft_root"][i].view(1)]).float()
        k += n
        if torch.isnan(s).any():
            out.append(None)
            continue
        s = s.clamp(eps, 1 - eps)
        out.append(torch.softmax((s.log() - (1 - s).log()) / temperature, 0).to(batch["gold"].device))
    return out


class Reranker(Role):
    name = "reranker"
    bundle_kinds = {"encoder": "cross_encoder", "decoder": "llm_scorer"}
    report_columns = {"acc@1": "acc@1", "mrr": "MRR", "new_root_f1": "new-root F1", "loss": "held-out loss"}

    def check(self, c: dict) -> None:
        t, m = c["task"], c["model"]
        if t["head"] == "yes_no" and m["family"] != "decoder":
            raise ConfigError(f"task={t['name']} scores p(yes) with a causal LM; model={m['name']} is an encoder")
        if t["head"] == "classifier" and m["family"] != "encoder":
            raise ConfigError(f"task={t['name']} with a classification head needs an encoder model, "
                              f"got model={m['name']} (family {m['family']})")
        from ..runtime.rerank import EXTRA_PAIR_FEATURES

        extra = t.get("pair_extra") or []
        if isinstance(extra, str) or any(e not in EXTRA_PAIR_FEATURES for e in extra):
            raise ConfigError(f"option task.pair_extra must be a list of pair feature groups "
                              f"({', '.join(EXTRA_PAIR_FEATURES)}), got {extra!r}")
        dist = t.get("distill") or {}
        w, temp = dist.get("weight", 0.0), dist.get("temperature", 1.0)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1:
            raise ConfigError(f"option task.distill.weight is the share of the loss on the teacher's distribution, "
                              f"from 0 to 1, got {w!r}")
        if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp <= 0:
            raise ConfigError(f"option task.distill.temperature must be a number above 0, got {temp!r}")
        if (extra or t.get("pair_logit_input")) and not t.get("pair_features"):
            raise ConfigError("options task.pair_extra and task.pair_logit_input extend the pair-feature head: "
                              "set task.pair_features=true")

    def build(self, c: dict) -> Built:
        t, dc = c["task"], c["data"]
        names = list(t["sets"])
        tr_rows, va_rows = load_rows(c, names)
        groups: dict[str, list[D.RerankGroup]] = {"train": [], "val": []}
        for split, rows in (("train", tr_rows), ("val", va_rows)):
            for n in names:
                groups[split] += D.rerank_groups(rows[n], n, t["group_size"], t["include_new_root"], **group_options(t))
        groups["train"] = cap(groups["train"], dc.get("max_train_examples"))
        groups["val"] = cap(groups["val"], dc.get("max_val_examples"))
        mixed, mixed_sessions = mix_groups(c)
        groups["train"] += mixed
        pair = bool(t.get("pair_features"))
        if pair and c["model"]["family"] == "decoder":
            raise ConfigError(f"option task.pair_features=true needs a cross-encoder; model={c['model']['name']} "
                              "is a decoder (task=reranker_llm)")
        if c["model"]["family"] == "decoder":  # LLM scorer: p(yes) at the answer position, Qwen3-Reranker layout
            from ..runtime.llm import yes_no_ids

            model, tok = build_decoder(c["model"], seed=c["seed"])
            model = add_lora(model, c["peft"], c["model"], "CAUSAL_LM")
            yes_no = torch.tensor(yes_no_ids(tok))
            encode = D.encode_groups_llm
        else:
            model, tok = build_encoder(c["model"], num_labels=1, seed=c["seed"])
            model = add_lora(model, c["peft"], c["model"], "SEQ_CLS", modules_to_save=list(c["model"]["head_modules"]))
            yes_no = None

            extra = list(t.get("pair_extra") or [])

            def encode(groups, tok, max_length):
                return D.encode_groups(groups, tok, max_length, pair_features=pair, extra=extra)
        pad = tok.pad_token_id

        def collate(b):
            out = D.collate_groups(b, pad)
            if yes_no is not None:
                out["yes_no"] = yes_no
                out.pop("token_type_ids", None)
            return out

        train_loader, val_loader = loaders(c, encode(groups["train"], tok, t["max_length"]),
                                           encode(groups["val"], tok, t["max_length"]), collate)
        fp = D.fingerprint(dc["train_dir"], names)
        for src in dc.get("mix") or []:
            fp += "+" + D.fingerprint(src["dir"], list(src["sets"])) + ":" + json.dumps(
                {"sessions": src.get("sessions"), "exclude": sorted(map(str, src.get("exclude_sessions") or [])),
                 "max_groups": src.get("max_groups")}, sort_keys=True)
        return Built(RerankerModule(model, c), tok, train_loader, val_loader, fp,
                     {"groups": groups, "mixed": len(mixed), "mixed_sessions": mixed_sessions})

    def baselines(self, c: dict, built: Built, trainer) -> dict[str, Any]:
        from ..runtime import default_config
        from ..runtime.rerank import HeuristicReranker
        from ..scoring.training import rerank_metrics

        out = super().baselines(c, built, trainer)
        rcfg = default_config()
        h = HeuristicReranker(**rcfg["reranker"]["heuristic"])
        groups = []
        for g in built.extras["groups"]["val"]:
            cands = [D.candidate_of(x) for x in g.cands]
            groups.append({"scores": h.score(g.query, cands), "gold": None if g.gold < 0 else g.gold,
                           "threshold": rcfg["localization"]["new_root_threshold"]})
        out["heuristic"] = rerank_metrics(groups)
        return out

    def after_fit(self, c: dict, built: Built) -> dict[str, Any]:
        if not c["task"]["pair_refit"]["enabled"] or built.module.pair_head is None:
            return {}
        return {"pair_refit": refit_pair_head(built.module, built.tokenizer, c)}

    def extras(self, c: dict, built: Built) -> dict[str, Any]:
        out: dict[str, Any] = {"new_root_threshold": round(built.module.threshold, 6),
                               "question_document": group_options(c["task"])["question_document"]}
        if built.extras.get("mixed_sessions"):
            out["training_sessions"] = built.extras["mixed_sessions"]
        if built.module.pair_head is not None:
            out["pair_head"] = built.module.pair_head.to_json(float(built.module.new_root_logit.detach()))
        return out

    def prompt_template(self, kind: str) -> dict:
        if kind == "llm_scorer":
            return RERANK_TEMPLATE.to_json()
        return {"name": "cross_encoder_pair", "version": PROMPT_VERSION}

    def load_base(self, train_cfg: dict, role_json: dict):
        m = train_cfg["model"]
        if m["family"] == "encoder":
            return build_encoder(m, num_labels=1, seed=train_cfg["seed"])[0]
        return build_decoder(m, seed=train_cfg["seed"])[0]

    def plug_overrides(self, bundle: Path | str, task: dict) -> list[str]:
        return [f"runtime.reranker.bundle.path={bundle}"]


ROLE = Reranker()
