"""The fact-extraction evaluation against LoCoMo observations (eval/extraction.py): the observations are
aligned to the interactions that cite them, and the metric counts what it should."""

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.paths import CONF_DIR, REPO_ROOT

LOCOMO = REPO_ROOT.parent / "shared" / "data" / "locomo"
pytestmark = pytest.mark.skipif(not LOCOMO.exists(), reason="../shared/data/locomo is not beside the repository")


def xcfg(run_dir, *o):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="extraction", overrides=[f"input={LOCOMO}", f"run_dir={run_dir}", *o])


class Oracle:
    """An extractor that returns, for each interaction, the observations citing it (plus `extra` made-up facts)."""

    name = "oracle"

    def __init__(self, gold_by_text: dict, extra: int = 0):
        self.gold, self.extra = gold_by_text, extra

    def run(self, kind, turns):
        out = []
        for t in turns:
            facts = [{"text": f, "entities": [], "tags": []} for f in self.gold.get((t.user_text, t.assistant_text), [])]
            facts += [{"text": f"zebra quartz {k} violin", "entities": [], "tags": []} for k in range(self.extra)]
            out.append(facts)
        return out


def gold_by_interaction(conv_id: str, n: int) -> dict:
    from arbor_train.conversations.locomo import load_locomo
    from arbor_train.conversations.schema import interactions
    from data_gen.locomo import observation_facts

    conv = next(c for c in load_locomo(LOCOMO) if c.conversation_id == conv_id)
    inters = interactions(conv)
    facts = observation_facts(conv, {tid: i for i, it in enumerate(inters) for tid in it.turn_ids})
    return {(it.user, it.assistant): [f["text"] for f in facts.get(i, [])] for i, it in enumerate(inters[:n])}


def test_observations_align_with_the_interactions_that_cite_them(tmp_path, monkeypatch):
    import arbor_train.runtime.extract as X
    from eval.extraction import run

    gold = gold_by_interaction("26", 30)
    n_gold = sum(map(len, gold.values()))
    assert n_gold > 5
    real = X.ExtractorSet.__init__

    def with_oracle(extra):
        def init(self, specs, heur=None, enabled=None):
            real(self, specs, heur, enabled)
            self.by_kind["facts"] = Oracle(gold, extra)
        return init

    monkeypatch.setattr(X.ExtractorSet, "__init__", with_oracle(0))
    res = run(xcfg(tmp_path / "a", "conversations=['26']", "max_interactions=30"))
    assert (res["interactions"], res["gold_facts"], res["predicted_facts"]) == (30, n_gold, n_gold)
    assert res["precision"] == res["recall"] == res["f1"] == 1.0 and res["json_validity"] == 1.0
    monkeypatch.setattr(X.ExtractorSet, "__init__", with_oracle(1))  # one made-up fact per interaction
    res = run(xcfg(tmp_path / "b", "conversations=['26']", "max_interactions=30"))
    assert res["recall"] == 1.0 and res["precision"] == pytest.approx(n_gold / (n_gold + 30))


def test_bad_options_name_the_option(tmp_path):
    from arbor_train.errors import UserError
    from eval.extraction import run

    with pytest.raises(UserError, match=r"option conversations: \['nope'\] not in"):
        run(xcfg(tmp_path, "conversations=[nope]"))
    with pytest.raises(UserError, match=r"option extractor must be one of heuristic, prompted, bundle"):
        run(xcfg(tmp_path, "extractor=magic"))
    with pytest.raises(UserError, match=r"extractor=bundle needs option bundle.path"):
        run(xcfg(tmp_path, "extractor=bundle"))
