"""Hand-computed cases for arbor_train.scoring.training (the arithmetic is in the comments)."""

import pytest

from arbor_train.scoring.training import (
    fact_f1,
    json_validity,
    normalize_value,
    rerank_metrics,
    slot_f1,
    tag_metrics,
    token_f1,
    tokenize_for_f1,
)

# --------------------------------------------------------------------------------------------------
# rerank_metrics


def test_rerank_ties_break_to_lowest_index():
    groups = [
        # argmax of a 0.9/0.9 tie is index 1, gold is 2 -> miss; rank = 1 + 0 higher + 1 tied before = 2
        {"scores": [0.2, 0.9, 0.9], "gold": 2},
        # gold 0 is the top score -> hit, rank 1
        {"scores": [0.5, 0.1, 0.3], "gold": 0},
        # 0.7 and 0.4 are above 0.1 -> rank 3
        {"scores": [0.7, 0.1, 0.4], "gold": 1},
        # tie where gold is the lowest tied index -> hit, rank 1
        {"scores": [0.9, 0.9], "gold": 0},
    ]
    m = rerank_metrics(groups)
    # acc@1 = 2/4 = 0.5 ; mrr = (1/2 + 1 + 1/3 + 1) / 4 = (17/6) / 4 = 17/24
    assert m["acc@1"] == pytest.approx(0.5)
    assert m["mrr"] == pytest.approx(17 / 24)
    assert m["groups"] == 4
    assert m["with_gold"] == 4
    # no thresholds, no gold new roots -> new-root metrics undefined
    assert m["new_root_precision"] is None
    assert m["new_root_recall"] is None
    assert m["new_root_f1"] is None


def test_rerank_new_root_threshold_precision_recall():
    groups = [
        {"scores": [0.2, 0.3], "gold": None, "threshold": 0.5},  # max 0.3 < 0.5 -> predicted; TP
        {"scores": [0.6, 0.1], "gold": None, "threshold": 0.5},  # 0.6 >= 0.5 -> not predicted; FN
        {"scores": [0.4], "gold": 0, "threshold": 0.5},  # predicted new root, gold is 0 -> FP; rank 1
        {"scores": [], "gold": None, "threshold": None},  # no candidates -> predicted; TP
        {"scores": [0.5, 0.2], "gold": 1, "threshold": 0.5},  # 0.5 is not < 0.5 -> not predicted; rank 2
        {"scores": [0.1], "gold": None},  # no threshold -> never predicted; FN
    ]
    m = rerank_metrics(groups)
    # predicted = 3 (groups 0, 2, 3), gold new roots = 4 (groups 0, 1, 3, 5), TP = 2
    # precision = 2/3, recall = 2/4 = 0.5, f1 = 2*2 / (3+4) = 4/7
    assert m["new_root_precision"] == pytest.approx(2 / 3)
    assert m["new_root_recall"] == pytest.approx(0.5)
    assert m["new_root_f1"] == pytest.approx(4 / 7)
    # ranking only over the 2 groups with gold: acc@1 = 1/2, mrr = (1 + 1/2) / 2 = 0.75
    assert m["groups"] == 6
    assert m["with_gold"] == 2
    assert m["acc@1"] == pytest.approx(0.5)
    assert m["mrr"] == pytest.approx(0.75)


def test_rerank_only_none_gold_and_no_predictions():
    m = rerank_metrics([{"scores": [0.3, 0.2], "gold": None, "threshold": None}])
    # nothing predicted -> precision None; 1 gold new root, 0 found -> recall 0; f1 = 0 / (0+1) = 0
    assert m["acc@1"] is None
    assert m["mrr"] is None
    assert m["new_root_precision"] is None
    assert m["new_root_recall"] == 0.0
    assert m["new_root_f1"] == 0.0
    assert m["groups"] == 1
    assert m["with_gold"] == 0


def test_rerank_predicted_but_no_gold_new_root():
    m = rerank_metrics([{"scores": [0.1, 0.05], "gold": 0, "threshold": 0.2}])
    # 1 predicted, 0 gold new roots -> precision 0/1 = 0, recall None, f1 = 0 / (1+0) = 0
    assert m["new_root_precision"] == 0.0
    assert m["new_root_recall"] is None
    assert m["new_root_f1"] == 0.0
    assert m["acc@1"] == 1.0  # the threshold does not affect ranking metrics
    assert m["mrr"] == 1.0


def test_rerank_empty():
    m = rerank_metrics([])
    assert m == {
        "acc@1": None,
        "mrr": None,
        "new_root_precision": None,
        "new_root_recall": None,
        "new_root_f1": None,
        "groups": 0,
        "with_gold": 0,
    }


@pytest.mark.parametrize(
    "group",
    [
        {"scores": [0.1, 0.2], "gold": 2},
        {"scores": [0.1, 0.2], "gold": -1},
        {"scores": [], "gold": 0},
        {"scores": [float("nan"), 0.2], "gold": 1},
    ],
)
def test_rerank_invalid(group):
    with pytest.raises(ValueError):
        rerank_metrics([group])


# --------------------------------------------------------------------------------------------------
# json_validity


def test_json_validity_strict():
    texts = [
        '{"a": 1}',  # valid
        "[1, 2]",  # valid
        '```json\n{"a": 1}\n```',  # fenced -> invalid
        "{'a': 1}",  # single quotes -> invalid
        '{"a": 1,}',  # trailing comma -> invalid
        "",  # empty -> invalid
        '  "x"  ',  # a JSON string with surrounding whitespace -> valid
        "null",  # valid
    ]
    # 4 valid / 8 = 0.5
    assert json_validity(texts) == pytest.approx(0.5)


def test_json_validity_edges():
    assert json_validity([]) == 0.0
    assert json_validity(['Sure! {"a": 1}']) == 0.0
    assert json_validity(['{"a": [1, {"b": null}]}']) == 1.0


# --------------------------------------------------------------------------------------------------
# slot_f1


def test_normalize_value():
    assert normalize_value('  "Hotel   Infante!" ') == "hotel infante"
    assert normalize_value("St. Louis.") == "st. louis"  # inner punctuation kept
    assert normalize_value("'June 3';") == "june 3"
    assert normalize_value(1500) == "1500"
    assert normalize_value(None) == ""


def test_slot_f1_multiset_and_normalization():
    pred = [
        [
            {"key": "budget", "value": "$1500."},
            {"key": "city", "value": "  Lisbon "},
            {"key": "city", "value": "Lisbon"},  # duplicate: only one gold city to match
        ],
        [{"key": "date", "value": "June 3"}],
        [],
        [],
    ]
    gold = [
        [{"key": "budget", "value": "$1500"}, {"key": "city", "value": "lisbon"}],
        [{"key": "date", "value": "June 4"}, {"key": "venue", "value": "Hotel Infante"}],
        [],  # empty/empty contributes nothing
        [{"key": "name", "value": "Alice"}],
    ]
    m = slot_f1(pred, gold)
    # keys: ex0 tp 2 (budget, one city) np 3 ng 2; ex1 tp 1 (date) np 1 ng 2; ex3 tp 0 np 0 ng 1
    #   -> tp 3, np 4, ng 5: P = 3/4, R = 3/5, F1 = 6/9 = 2/3
    assert m["key_precision"] == pytest.approx(0.75)
    assert m["key_recall"] == pytest.approx(0.6)
    assert m["key_f1"] == pytest.approx(2 / 3)
    # values: ex0 tp 2 ("$1500", "lisbon" once); ex1 tp 0 (june 3 != june 4); ex3 tp 0
    #   -> tp 2, np 4, ng 5: P = 2/4, R = 2/5, F1 = 4/9
    assert m["value_precision"] == pytest.approx(0.5)
    assert m["value_recall"] == pytest.approx(0.4)
    assert m["value_f1"] == pytest.approx(4 / 9)


def test_slot_f1_duplicate_gold_needs_duplicate_pred():
    m = slot_f1([[{"key": "a", "value": "x"}]], [[{"key": "a", "value": "x"}, {"key": "a", "value": "X "}]])
    # gold multiset {(a, x): 2}, pred {(a, x): 1} -> tp 1, np 1, ng 2: P 1, R 1/2, F1 2/3
    assert m["value_precision"] == 1.0
    assert m["value_recall"] == pytest.approx(0.5)
    assert m["value_f1"] == pytest.approx(2 / 3)
    assert m["key_f1"] == pytest.approx(2 / 3)


def test_slot_f1_value_needs_same_key():
    m = slot_f1([[{"key": "city", "value": "Lisbon"}]], [[{"key": "destination", "value": "Lisbon"}]])
    assert m["key_f1"] == 0.0
    assert m["value_f1"] == 0.0


def test_slot_f1_empty():
    ones = {k: 1.0 for k in ("key_precision", "key_recall", "key_f1", "value_precision", "value_recall", "value_f1")}
    assert slot_f1([], []) == ones
    assert slot_f1([[], []], [[], []]) == ones
    # nothing predicted but gold exists: everything 0
    m = slot_f1([[]], [[{"key": "a", "value": "b"}]])
    assert m["key_precision"] == 0.0 and m["key_recall"] == 0.0 and m["key_f1"] == 0.0
    # predictions but no gold: everything 0
    m = slot_f1([[{"key": "a", "value": "b"}]], [[]])
    assert m["value_precision"] == 0.0 and m["value_recall"] == 0.0 and m["value_f1"] == 0.0


def test_slot_f1_invalid():
    with pytest.raises(ValueError):
        slot_f1([[]], [])
    with pytest.raises(ValueError):
        slot_f1([[{"value": "x"}]], [[]])


# --------------------------------------------------------------------------------------------------
# token_f1 / fact_f1


def test_tokenize_for_f1():
    assert tokenize_for_f1("The budget is $1,500!") == ["budget", "is", "1500"]
    assert tokenize_for_f1("An apple a day") == ["apple", "day"]


def test_token_f1():
    # [budget, is, 1500] vs [budget, 1500]: common 2, P 2/3, R 1, F1 = 2*(2/3)/(5/3) = 0.8
    assert token_f1("The budget is $1500", "budget 1500") == pytest.approx(0.8)
    # multiset: [ran, ran] vs [ran]: common 1, P 1/2, R 1, F1 = 2/3
    assert token_f1("ran ran", "ran") == pytest.approx(2 / 3)
    assert token_f1("an apple", "the") == 0.0  # one side has no tokens
    assert token_f1("the", "a") == 1.0  # neither side has tokens
    assert token_f1("red wine", "blue cheese") == 0.0
    assert token_f1("Alice's budget.", "alices BUDGET") == 1.0


def test_fact_f1_one_to_one():
    pred = [["Alice's budget is 1500"]]
    gold = [["Alice's budget is 1500", "Alice budget 1500"]]
    # [alices, budget, is, 1500] vs [alice, budget, 1500]: common 2, P 2/4, R 2/3, F1 4/7 >= 0.5,
    # so the pred fact fits both gold facts (1.0 and 4/7) but matches only once: tp 1, np 1, ng 2
    # P 1, R 1/2, F1 2/3
    m = fact_f1(pred, gold)
    assert m["precision"] == 1.0
    assert m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(2 / 3)


def test_fact_f1_greedy_takes_best_pairs_first():
    # F1(p0, g0) = 6/7 (3 common of 4 and 3 tokens), F1(p0, g1) = 1, F1(p1, g0) = 1, F1(p1, g1) = 6/7.
    # Greedy by score takes p0-g1 and p1-g0 (both 1.0): tp 2, np 2, ng 2 -> F1 1.
    pred = [["alice likes red wine", "alice likes wine"]]
    gold = [["alice likes wine", "alice likes red wine"]]
    assert fact_f1(pred, gold)["f1"] == 1.0
    # two preds that both only fit one gold fact: one match. p0/g0 = 1.0, p1/g0 = 6/7; tp 1, np 2, ng 1
    # P 1/2, R 1, F1 2/3
    m = fact_f1([["alice likes wine", "alice likes red wine"]], [["alice likes wine"]])
    assert m["precision"] == pytest.approx(0.5)
    assert m["recall"] == 1.0
    assert m["f1"] == pytest.approx(2 / 3)


def test_fact_f1_threshold():
    # [bob, ran, 5, km] vs [bob, ran, 8, km]: common 3, P = R = 3/4, F1 = 0.75
    pred, gold = [["Bob ran 5 km"]], [["Bob ran 8 km"]]
    assert fact_f1(pred, gold, threshold=0.5)["f1"] == 1.0
    assert fact_f1(pred, gold, threshold=0.75)["f1"] == 1.0  # >= threshold matches
    assert fact_f1(pred, gold, threshold=0.8)["f1"] == 0.0


def test_fact_f1_micro_over_examples():
    pred = [["alice likes wine"], ["bob ran", "carol swims"]]
    gold = [["alice likes wine", "dave cooks"], []]
    # ex0 tp 1 np 1 ng 2; ex1 tp 0 np 2 ng 0 -> tp 1, np 3, ng 2: P 1/3, R 1/2, F1 2/5
    m = fact_f1(pred, gold)
    assert m["precision"] == pytest.approx(1 / 3)
    assert m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(0.4)


def test_fact_f1_empty_and_invalid():
    assert fact_f1([], []) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert fact_f1([[]], [[]]) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert fact_f1([[]], [["x y"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    with pytest.raises(ValueError):
        fact_f1([[]], [[]], threshold=1.5)
    with pytest.raises(ValueError):
        fact_f1([[]], [])


# --------------------------------------------------------------------------------------------------
# tag_metrics

PRED_TAGS = [["plan"], ["plan", "event"], [], ["plan", "plan"]]
GOLD_TAGS = [["plan"], ["plan"], ["preference"], ["plan"]]


def test_tag_metrics_micro_vs_macro():
    m = tag_metrics(PRED_TAGS, GOLD_TAGS, ["plan", "event", "preference"])
    # exact: ex0 yes, ex1 no, ex2 no, ex3 yes (duplicate collapses) -> 2/4
    assert m["exact_match"] == pytest.approx(0.5)
    # plan: tp 3, pred 3, gold 3 -> 1.0 ; event: tp 0, pred 1, gold 0 -> 0 ; preference: tp 0, pred 0, gold 1 -> 0
    assert m["per_label"] == {"plan": 1.0, "event": 0.0, "preference": 0.0}
    # macro = (1 + 0 + 0) / 3 = 1/3 ; micro = 2*3 / (4 + 4) = 0.75
    assert m["macro_f1"] == pytest.approx(1 / 3)
    assert m["micro_f1"] == pytest.approx(0.75)


def test_tag_metrics_absent_label_scores_one():
    m = tag_metrics(PRED_TAGS, GOLD_TAGS, ["plan", "event", "preference", "status"])
    # status: no gold, no pred -> 1.0 ; macro = (1 + 0 + 0 + 1) / 4 = 0.5 ; micro unchanged 0.75
    assert m["per_label"]["status"] == 1.0
    assert m["macro_f1"] == pytest.approx(0.5)
    assert m["micro_f1"] == pytest.approx(0.75)


def test_tag_metrics_unknown_pred_tag_is_false_positive():
    m = tag_metrics([["plan", "bogus"]], [["plan"]], ["plan"])
    # micro: tp 1, pred 2 (bogus counts), gold 1 -> 2/3 ; per-label plan 1.0 ; exact 0
    assert m["micro_f1"] == pytest.approx(2 / 3)
    assert m["per_label"] == {"plan": 1.0}
    assert m["macro_f1"] == 1.0
    assert m["exact_match"] == 0.0


def test_tag_metrics_empty_and_invalid():
    m = tag_metrics([], [], ["plan", "event"])
    assert m == {"exact_match": None, "micro_f1": 1.0, "macro_f1": 1.0, "per_label": {"plan": 1.0, "event": 1.0}}
    m = tag_metrics([[]], [[]], ["plan"])
    assert m["exact_match"] == 1.0 and m["micro_f1"] == 1.0
    with pytest.raises(ValueError):
        tag_metrics([["plan"]], [["unknown"]], ["plan"])
    with pytest.raises(ValueError):
        tag_metrics([[]], [[]], [])
    with pytest.raises(ValueError):
        tag_metrics([[]], [], ["plan"])


def test_extraction_metrics_per_kind_on_hand_worked_cases():
    from arbor_train.scoring.training import extraction_metrics

    # summary: identical -> 1; "the cat sat" vs "the cat sat down": LCS 3, P 1, R 3/4 -> F 6/7
    assert extraction_metrics("summary", ["a b c", "the cat sat"], ["a b c", "the cat sat down"])["rouge_l"] \
        == pytest.approx((1 + 6 / 7) / 2)
    # entities: 2 of 3 predicted right, 2 of 4 gold found -> P 2/3, R 1/2, F 4/7; case and spaces normalized
    m = extraction_metrics("entities", [["Alice", " bob", "Lisbon"]], [["alice", "Bob", "Porto", "Maya"]])
    assert (m["entity_precision"], m["entity_recall"], m["entity_f1"]) == pytest.approx((2 / 3, 1 / 2, 4 / 7))
    # events: exact needs subject, action and quantity (4.0 == 4); the second event's quantity differs
    ev_p = [[{"subject": "user", "action": "run", "quantity": 4, "text": "I ran 4 km"},
             {"subject": "user", "action": "spend", "quantity": 30, "text": "I spent 30 euros"}]]
    ev_g = [[{"subject": "user", "action": "run", "quantity": 4.0, "text": "I ran 4 km"},
             {"subject": "user", "action": "spend", "quantity": 35, "text": "I spent 30 euros"}]]
    m = extraction_metrics("events", ev_p, ev_g)
    assert m["event_exact_f1"] == pytest.approx(0.5) and m["event_text_f1"] == pytest.approx(1.0)
    # artifacts: order matters for exact; items are matched as a multiset
    a_p = [[{"name": "itinerary", "items": ["Lyon", "Nice"]}]]
    a_g = [[{"name": "itinerary", "items": ["Nice", "Lyon"]}]]
    m = extraction_metrics("artifacts", a_p, a_g)
    assert m["artifact_exact_f1"] == 0.0 and m["artifact_item_f1"] == 1.0
    # invalid output (None) predicts nothing: recall 0 against one gold fact
    m = extraction_metrics("facts", [None], [[{"text": "Alice lives in Lisbon"}]])
    assert (m["fact_precision"], m["fact_recall"], m["fact_f1"]) == (0.0, 0.0, 0.0)
    m = extraction_metrics("states", [[{"key": "budget", "value": "400"}]], [[{"key": "budget", "value": "400 "}]])
    assert m["slot_value_f1"] == 1.0
    with pytest.raises(ValueError, match="unknown extraction kind"):
        extraction_metrics("opinions", [], [])


def test_the_sign_test_is_exact_on_the_discordant_questions():
    from arbor_train.scoring.paired import paired, sign_test

    assert sign_test(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0.109375, worked out by hand
    assert sign_test(0, 0) == 1.0 and sign_test(5, 5) == pytest.approx(1.0)
    a = [True] * 8 + [False] * 2 + [True] * 30 + [False] * 60
    b = [False] * 8 + [True] * 2 + [True] * 30 + [False] * 60
    r = paired(a, b)
    assert (r["a_only"], r["b_only"], r["questions"]) == (8, 2, 100)
    assert r["difference"] == pytest.approx(0.06) and r["sign_test_p"] == pytest.approx(0.109375)
    assert r["ci"][0] < 0 < r["ci"][1]  # 8 against 2 of 100 is not enough to tell


def test_the_paired_interval_agrees_with_a_paired_bootstrap():
    """Newcombe's interval against 20,000 paired bootstrap resamples of 120 questions (seeded): both ends
    within 0.02; and a clear difference excludes 0."""
    import random

    from arbor_train.scoring.paired import paired

    rng = random.Random(0)
    a = [rng.random() < 0.55 for _ in range(120)]
    b = [x and rng.random() < 0.6 for x in a]  # b misses about 40% of what a gets right
    r = paired(a, b)
    diffs = []
    for _ in range(20000):
        idx = [rng.randrange(120) for _ in range(120)]
        diffs.append(sum(a[i] - b[i] for i in idx) / 120)
    diffs.sort()
    lo, hi = diffs[int(0.025 * 20000)], diffs[int(0.975 * 20000)]
    assert abs(r["ci"][0] - lo) < 0.02 and abs(r["ci"][1] - hi) < 0.02, (r["ci"], lo, hi)
    assert r["ci"][0] > 0 and r["sign_test_p"] < 0.05
    with pytest.raises(ValueError, match="same questions"):
        paired([True], [True, False])
