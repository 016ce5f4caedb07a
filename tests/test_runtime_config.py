"""One runtime grammar: three independent axes (conf/runtime/{components,read_policy,domain}), each one
override, any key one more; every combination composes, and every key of conf/runtime is read."""

from __future__ import annotations

import itertools
import re

import pytest

from arbor_train.errors import ConfigError
from arbor_train.paths import CONF_DIR, REPO_ROOT
from arbor_train.runtime.config import AXES, check_overrides, choices, default_config, label, options, settings

# maps whose keys are data (cue phrases, tag names, extraction kinds), not options
DATA_MAPS = {"heuristics.implied", "heuristics.event_categories", "ontology", "choices", "extractors"}
COMBINATIONS = list(itertools.product(*(options(a) for a in AXES)))


def leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v and path not in DATA_MAPS:
            yield from leaves(v, path + ".")
        else:
            yield path


def test_the_shipped_choices():
    assert options("components") == ["heuristic", "minilm", "prompted_smollm2", "tuned", "tuned_all",
                                      "tuned_every_kind", "tuned_one_pass", "tuned_spans", "untuned_smollm2"]
    assert options("read_policy") == ["cross_session", "cross_session_v1", "default"]
    assert options("domain") == ["assistant", "group_chat", "group_chat_wide"]


@pytest.mark.parametrize("combo", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_every_combination_composes_and_records_its_choices(combo):
    from arbor_train.runtime.layers import check_layers

    overrides = [f"runtime/{a}={o}" for a, o in zip(AXES, combo)]
    c = default_config(*overrides)
    assert choices(c) == dict(zip(AXES, combo))
    check_layers(c["context"])
    # each axis sets only its own part: the other two compose to the same values whatever it is
    alone = {a: default_config(f"runtime/{a}={o}") for a, o in zip(AXES, combo)}
    assert c["context"] == alone["read_policy"]["context"]
    assert c["recall"] == alone["domain"]["recall"] and c["localization"] == alone["domain"]["localization"]
    for part in ("embedder", "tagger", "extractors"):
        assert c[part] == alone["components"][part], part
    assert c["reranker"]["kind"] == alone["components"]["reranker"]["kind"]
    assert settings(c) == []  # nothing set on top of the choices


def test_one_choice_is_one_override_and_a_key_is_one_more():
    c = default_config("runtime/components=tuned", "runtime/read_policy=cross_session", "runtime/domain=group_chat",
                       "runtime.reranker.bundle.path=outputs/bundles/reranker")
    assert (c["reranker"]["kind"], c["embedder"]["kind"]) == ("bundle", "sentence")
    assert c["recall"]["k_recent"] == 20 and c["context"]["layers"][2] == {"layer": "localized_states", "share": 0.5}
    assert label(c) == "tuned/cross_session/group_chat"
    assert settings(c) == ["runtime.reranker.bundle.path=outputs/bundles/reranker"]
    assert label(default_config()) == "heuristic"


@pytest.mark.parametrize("bad, msg", [
    ("runtime_profile=tuned", "does not address the runtime"),
    ("runtime/profile=tuned", "names no runtime axis"),
    ("runtime/components=nope", r"runtime/components=nope: not one of heuristic, minilm"),
    ("reranker.kind=bundle", "does not address the runtime"),
    ("runtime.reranker.no_such_key.deeper=1", "runtime overrides"),
])
def test_an_override_outside_the_grammar_is_refused_naming_it(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        default_config(bad)


def test_check_overrides_names_the_option():
    with pytest.raises(ConfigError, match=r"option eval.tuned_runtime: 'tuned'"):
        check_overrides(["tuned"], "eval.tuned_runtime")


def test_no_entry_point_takes_the_old_grammar():
    """runtime_profile / runtime_overrides are gone from every entry config and command."""
    texts = [p.read_text() for p in CONF_DIR.rglob("*.yaml")]
    texts += [p.read_text() for d in ("arbor_train", "data_gen", "eval", "slurm") for p in (REPO_ROOT / d).rglob("*")
              if p.is_file() and p.suffix in (".py", ".sh", ".sbatch", ".yaml")]
    assert not [t for t in texts if "runtime_profile" in t or "runtime_overrides" in t]
    for name in ("eval", "forgetting", "reader_data", "irc", "locomo", "data_gen", "extraction", "runtime_cli"):
        text = (CONF_DIR / f"{name}.yaml").read_text()
        assert re.search(r"^  - runtime: default\b", text, re.M), name


def test_every_key_of_conf_runtime_is_read_by_the_code():
    """A key is read when the runtime names it (a string key, an attribute, a keyword parameter of what the
    block is passed to) or conf/runtime interpolates it; a dead key fails here."""
    code = "\n".join(p.read_text() for p in (REPO_ROOT / "arbor_train").rglob("*.py"))
    conf = "\n".join(p.read_text() for p in (CONF_DIR / "runtime").rglob("*.yaml"))
    keys = set()
    for combo in COMBINATIONS:
        keys |= set(leaves(default_config(*(f"runtime/{a}={o}" for a, o in zip(AXES, combo)))))
    unread = []
    for k in sorted(keys):
        name = re.escape(k.split(".")[-1])
        used = (re.search(rf"""["']{name}["']|\.{name}\b|\b{name}\s*(:\s*[\w\[| ]+)?=""", code)
                or re.search(rf"\$\{{runtime\.{re.escape(k)}\}}", conf))
        if not used:
            unread.append(k)
    assert not unread, f"keys of conf/runtime nothing reads: {unread}"


def test_the_store_lock_timeout_comes_from_the_yaml_alone():
    code = (REPO_ROOT / "arbor_train" / "runtime" / "memory.py").read_text() + (
        REPO_ROOT / "arbor_train" / "runtime" / "cli.py").read_text()
    assert 'get("lock_timeout_s"' not in code and default_config()["store"]["lock_timeout_s"] == 10
