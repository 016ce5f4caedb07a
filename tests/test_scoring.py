"""Hand-computed cases for arbor_train.scoring.answers (the arithmetic is in the comments)."""

import pytest
import Stemmer

from arbor_train.runtime.context import Block, Context
from arbor_train.scoring.answers import (
    ABSTENTION_PHRASES,
    ERROR_CATEGORIES,
    LOCOMO_CODE_ABSTENTION_PHRASES,
    STEMMER_ALGORITHM,
    aggregate,
    answer_correct,
    context_flags,
    error_category,
    is_hedge,
    locomo_f1,
    locomo_normalize,
    locomo_score,
    locomo_tokens,
    mentions,
    normalize_answer,
)

# --------------------------------------------------------------------------------------------------
# LoCoMo normalization and stemming


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Cat, and a DOG!", "cat dog"),  # commas, punctuation, a/an/the/and dropped, lowercased
        ("Hello,world", "helloworld"),  # commas are deleted, not replaced by a space
        ("don't", "dont"),  # ASCII punctuation is deleted inside words
        ("Andrew and Anna", "andrew anna"),  # "and" only as a whole word
        ("  an   apple\tthe\n end ", "apple end"),  # whitespace collapsed
        (2022, "2022"),  # integer answers are stringified
        (None, ""),
    ],
)
def test_locomo_normalize(text, expected):
    assert locomo_normalize(text) == expected


def test_stemmer_is_pystemmer_porter():
    assert STEMMER_ALGORITHM == "porter"
    assert STEMMER_ALGORITHM in Stemmer.algorithms()
    # running -> run, runs -> run, mountains -> mountain; the article "the" is dropped
    assert locomo_tokens("Running runs in the mountains") == ["run", "run", "in", "mountain"]


def test_stemming_makes_inflections_match():
    # "running" and "run" both stem to "run": 1 common token of 1 each -> F1 = 1.0
    assert locomo_f1("running", "run") == 1.0
    # "She was running" -> [she, wa, run] (Porter strips the s of "was"); gold [run]
    # overlap 1, P = 1/3, R = 1/1 -> F1 = 2 * (1/3) / (1/3 + 1) = 1/2
    assert locomo_f1("She was running", "run") == pytest.approx(0.5)


def test_locomo_f1_is_multiset_overlap():
    # pred [cat, cat, dog], gold [cat, dog, dog, bird]
    # overlap = min(2, 1) for cat + min(1, 2) for dog = 2
    # P = 2/3, R = 2/4 -> F1 = 2PR / (P + R) = (2/3) / (7/6) = 4/7
    assert locomo_f1("cat cat dog", "cat dog dog bird") == pytest.approx(4 / 7)
    # a set-based F1 would give {cat, dog} vs {cat, dog, bird}: P = 1, R = 2/3 -> 4/5; multiset differs
    assert locomo_f1("cat cat dog", "cat dog dog bird") != pytest.approx(4 / 5)


def test_locomo_f1_zero_overlap_and_empty():
    assert locomo_f1("Paris", "London") == 0.0
    # LoCoMo returns 0 when nothing overlaps, also for two empty strings (unlike SQuAD's 1.0)
    assert locomo_f1("", "") == 0.0
    assert locomo_f1("the", "a") == 0.0  # both normalize to no tokens
    assert locomo_f1("", "London") == 0.0


# --------------------------------------------------------------------------------------------------
# LoCoMo per-category rules


def test_category_1_splits_on_commas():
    # gold parts: London -> best 1.0 (pred part "London"); Rome -> 0.0; Paris -> 1.0
    # mean = (1 + 0 + 1) / 3 = 2/3
    assert locomo_score("Paris, London", "London, Rome, Paris", 1) == pytest.approx(2 / 3)
    # the plain F1 of the same pair: [pari, london] vs [london, rome, pari], overlap 2
    # -> 2 * 2 / (2 + 3) = 4/5
    assert locomo_score("Paris, London", "London, Rome, Paris", 4) == pytest.approx(4 / 5)


def test_category_1_partial_parts():
    # pred parts: "hiking in the mountains" -> [hike, in, mountain]; "swimming" -> [swim]
    # gold "hiking" -> [hike]: vs part 1 overlap 1 -> 2*1/(3+1) = 1/2; vs part 2 -> 0; best 1/2
    # gold "swimming pool" -> [swim, pool]: vs part 1 -> 0; vs part 2 overlap 1 -> 2*1/(1+2) = 2/3
    # mean = (1/2 + 2/3) / 2 = 7/12
    score = locomo_score("hiking in the mountains, swimming", "hiking, swimming pool", 1)
    assert score == pytest.approx(7 / 12)


def test_category_3_cuts_gold_at_first_semicolon():
    gold = "Likely yes; she mentions enjoying it"
    # cut gold "Likely yes" -> [like, ye]; pred [ye]; overlap 1 -> 2*1/(1+2) = 2/3
    assert locomo_score("yes", gold, 3) == pytest.approx(2 / 3)
    # without the cut (category 4): gold [like, ye, she, mention, enjoi, it] (6 tokens)
    # -> 2*1/(1+6) = 2/7
    assert locomo_score("yes", gold, 4) == pytest.approx(2 / 7)


def test_category_2_and_4_are_plain_f1():
    # [7, may, 2023] vs [7, may, 2023] -> 1.0 ; the comma only separates, it is deleted
    assert locomo_score("7 May, 2023", "7 May 2023", 2) == 1.0
    # category 2 does not split on commas: [7, may, 2023] vs [may] -> 2*1/(3+1) = 1/2
    assert locomo_score("7 May, 2023", "May", 2) == pytest.approx(0.5)
    assert locomo_score("7 May, 2023", "May", 4) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        ("The information is not mentioned in the conversation.", 1.0),
        ("NO INFORMATION AVAILABLE", 1.0),  # case-insensitive
        ("That is not available.", 1.0),
        ("It cannot be determined from the chats.", 1.0),
        ("Unknown.", 1.0),
        ("The question is not answerable.", 1.0),
        ("She went to Paris.", 0.0),
        ("", 0.0),
    ],
)
def test_category_5_phrases(pred, expected):
    # the gold of category 5 is ignored (items usually carry only an adversarial_answer)
    assert locomo_score(pred, None, 5) == expected


def test_category_5_official_phrase_list():
    assert set(LOCOMO_CODE_ABSTENTION_PHRASES) == {"no information available", "not mentioned"}
    assert all(p == p.lower() for p in ABSTENTION_PHRASES)
    # "unknown" is in the broad list, not in LoCoMo's own two phrases
    assert locomo_score("Unknown", "x", 5) == 1.0
    assert locomo_score("Unknown", "x", 5, abstention_phrases=LOCOMO_CODE_ABSTENTION_PHRASES) == 0.0
    assert locomo_score("Not mentioned.", "x", 5, abstention_phrases=LOCOMO_CODE_ABSTENTION_PHRASES) == 1.0


def test_integer_answers():
    assert locomo_score(2022, 2022, 2) == 1.0
    # [in, 2022] vs [2022]: overlap 1 -> 2*1/(2+1) = 2/3
    assert locomo_score("In 2022", 2022, 2) == pytest.approx(2 / 3)
    assert locomo_score("3", 3, 1) == 1.0  # category 1 splits the stringified int
    assert locomo_score("3", 3, 3) == 1.0  # category 3 cuts the stringified int at ";"


def test_unknown_category_raises():
    with pytest.raises(ValueError, match="category"):
        locomo_score("a", "b", 6)


# --------------------------------------------------------------------------------------------------
# BranchMemEval normalization and matching


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The budget is $1,200.", "budget is 1200"),  # $ and thousands separator gone, final dot gone
        ("$1,200", "1200"),
        ("$1200.00", "1200"),  # trailing zero fraction dropped
        ("1,200,000", "1200000"),
        ("3,4", "3 4"),  # not a thousands separator
        ("12.5 km", "12.5 km"),  # a dot between digits stays
        ("0.05", "0.05"),  # not a zero fraction
        ("June 3rd, 2024", "june 3 2024"),  # ordinal suffix and punctuation dropped
        ("the Old Cathedral!", "old cathedral"),  # articles dropped
        ("Maria's hotel", "maria s hotel"),  # punctuation becomes a space
        (1200, "1200"),
        (None, ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_money_matching():
    assert answer_correct("The budget is $1,200.", "$1,200")
    assert answer_correct("1200 dollars", "$1,200")  # "1200 dollars" contains the token "1200"
    assert answer_correct("It's $1200.00 now", "$1,200")
    # "12000" is a different token from "1200", both ways
    assert not answer_correct("The budget is $12,000.", "$1,200")
    assert not answer_correct("The budget is $1,200.", "$12,000")


def test_number_matching_is_whole_token():
    assert answer_correct("3 payments", "3")
    assert not answer_correct("13 payments", "3")
    assert not answer_correct("3.5 hours", "3")
    assert answer_correct("There were 3.", 3)  # an int gold is stringified


def test_date_matching():
    assert answer_correct("It is on June 3.", "June 3")
    assert answer_correct("June 3rd", "June 3")
    assert answer_correct("On June 3, 2024", "June 3")
    assert not answer_correct("It is on June 30.", "June 3")
    assert not answer_correct("June 3", "June 30")


def test_mentions_and_ignore_inside():
    assert mentions("We visit the old cathedral first", "Old Cathedral")
    assert mentions("Maria Lopez", "Maria")
    # the only "maria" is part of "maria lopez"
    assert not mentions("Maria Lopez", "Maria", ignore_inside="Maria Lopez")
    # a second, free-standing "maria" counts
    assert mentions("Maria, not Maria Lopez", "Maria", ignore_inside="Maria Lopez")
    # ignore_inside equal to the value itself is ignored
    assert mentions("Maria", "Maria", ignore_inside="maria")
    # nothing to look for -> never mentioned
    assert not mentions("anything", "")
    assert not mentions("anything", None)
    assert not mentions("the", "the")  # normalizes to nothing
    assert not answer_correct("Maria Lopez", "Maria", confounder="Maria Lopez")


# --------------------------------------------------------------------------------------------------
# BranchMemEval hedges: the gold stated together with other candidate answers is not correct


def test_hedge_with_confounder_is_not_correct():
    # the gold $1500 is stated, but so is the confounder $1200
    assert not answer_correct("either $1200 or $1500", "$1500", "$1200")
    assert error_category("either $1200 or $1500", "$1500", "$1200", "[PrimaryPath]\nbudget $1,500") == "hedge"
    # the same with the confounder named apart from the gold, either order
    assert not answer_correct("It was $1,200, now it is $1,500.", "$1500", "$1200")
    assert not answer_correct("Marble Hall and Green Room Studio", "Marble Hall", "Green Room Studio")
    # the hedge class comes before trajectory_confusion (which also holds: the confounder is named)
    ctx = "[PrimaryPath]\nBen's budget is $1,200.\n[AtomicFacts]\nAnna's budget is $1,500."
    assert error_category("$1,200 or $1,500", "$1500", "$1200", ctx) == "hedge"


def test_value_dump_is_not_correct():
    # nine amounts, the gold among them, the confounder not: rule 2 (two or more other amounts)
    dump = "$100, $200, $300, $400, $500, $600, $700, $800, $1,500"
    assert not mentions(dump, "$1200")
    assert not answer_correct(dump, "$1500", "$1200")
    assert error_category(dump, "$1500", "$1200", "") == "hedge"
    # nine dates, nine counts, nine names
    dates = "May 1, May 2, May 3, May 4, June 3, May 6, May 7, May 8, May 9"
    assert not answer_correct(dates, "June 3", "June 30")
    assert not answer_correct("1, 2, 4, 5, 6, 7, 8, 9, 10", "4", "3")
    names = "Ada, Ben, Cy, Dan, Eve, Maria Lopez, Finn, Gus, Hal"
    assert not answer_correct(names, "Maria Lopez", "Maria")
    # an enumerated dump of items is a dump of numbers too (gold count 4, confounder 5)
    assert not answer_correct("1. museum\n2. tea house\n3. fish market\n4. coral reef", "4", "5")


def test_ordinary_answers_stay_correct():
    assert answer_correct("It's $1,500 now.", "$1500", "$1200")
    assert error_category("It's $1,500 now.", "$1500", "$1200", "") == "correct"
    # the confounder "Maria" lies inside the gold "Maria Lopez": not a statement of the confounder
    assert answer_correct("Maria Lopez", "Maria Lopez", "Maria")
    assert answer_correct("The coach is Maria Lopez.", "Maria Lopez", "Maria")
    # incidental numbers of another kind than the gold's
    assert answer_correct("The budget is $1,500 for 3 nights", "$1500", "$1200")  # 3 is not money
    assert answer_correct("[2025-01-03T18:58] The budget is $1,500", "$1500", "$1200")  # a timestamp
    assert answer_correct("4 rides over 2 days, 60 km in total", "4", "3")  # 2 days, 60 km: not rides
    assert answer_correct("60 km over 2 days with 5 stops", "60 km", "90 km")
    assert answer_correct("On June 3, 2024 at 18:00", "June 3", "June 30")  # the year and a clock time
    # one other value of the kind is not a hedge (two are needed unless joined by "or" / "/")
    assert answer_correct("$1,500, up from last year's $1,000", "$1500", "$1200")
    # arithmetic operands are working, not alternatives
    assert answer_correct("$180 + $110 = $290", "$290", "$145")
    # a long clause after a comma is not a list item
    assert answer_correct("The venue is Marble Hall, which is located in Munich and seats 107 guests.",
                          "Marble Hall", "Green Room Studio")
    assert answer_correct("Item 2 in the agenda is cocktail hour.", "cocktail hour", "city walking tour")
    # a gold holding a separator word stays one item
    assert answer_correct("Door or Window", "Door or Window", "Arch")


@pytest.mark.parametrize(
    ("pred", "gold", "confounder"),
    [
        ("$1,500 or $1,800", "$1500", "$1200"),  # "X or Y", Y an amount
        ("$1,500/$1,800", "$1500", "$1200"),  # "X/Y"
        ("1500 or 1800 dollars", "$1500", "$1200"),  # a bare number joined to an amount
        ("4 or 5", "4", "3"),
        ("4 rides or 5 rides", "4", "3"),
        ("60 km or 80 km", "60 km", "90 km"),
        ("June 3 or 4", "June 3", "June 30"),  # a bare day number joined to a date
        ("June 3 or July 5", "June 3", "June 30"),
        ("Marble Hall or Engine Room", "Marble Hall", "Green Room Studio"),
        ("Either Marble Hall or the Engine Room", "Marble Hall", "Green Room Studio"),
    ],
)
def test_explicit_alternative_is_a_hedge(pred, gold, confounder):
    assert mentions(pred, gold)
    assert is_hedge(pred, gold, confounder)
    assert not answer_correct(pred, gold, confounder)


@pytest.mark.parametrize(
    ("pred", "gold", "confounder"),
    [
        ("$900, $1,500, $1,800", "$1500", "$1200"),  # two other amounts
        ("$290: $180 for tickets, $110 for food", "$290", "$145"),  # a breakdown in words
        ("4, 5 or 6", "4", "3"),  # bare numbers
        ("60 km, 80 km or 120 km", "60 km", "90 km"),  # the gold's unit
        ("June 3, 2024 (moved from May 1, then April 2)", "June 3", "June 30"),  # two other dates
        ("Marble Hall, Engine Room, Chapel Loft", "Marble Hall", "Green Room Studio"),  # two short items
        ("1. recruiting mixer\n2. cocktail hour\n3. career fair", "cocktail hour", "city walking tour"),
    ],
)
def test_several_candidates_are_a_hedge(pred, gold, confounder):
    assert is_hedge(pred, gold, confounder)
    assert not answer_correct(pred, gold, confounder)


def test_hedge_needs_the_gold():
    # without the gold the old categories apply: naming the confounder is trajectory confusion
    assert error_category("$1,200 or $1,800", "$1500", "$1200", "") == "trajectory_confusion"
    # a dump without the gold and without the confounder is a miss of the usual kinds
    assert error_category("$100, $200, $300", "$1500", "$1200", "") == "retrieval_failure"
    # the gold only inside the confounder is not stated: "Maria Lopez" for gold "Maria"
    assert error_category("Maria Lopez", "Maria", "Maria Lopez", "") == "trajectory_confusion"


# --------------------------------------------------------------------------------------------------
# BranchMemEval error categories

GOLD, CONF = "$1,200", "$900"


def test_correct_comes_first():
    ctx = "[PrimaryPath]\nAnna's travel budget is $1,200."
    assert error_category("It is $1,200.", GOLD, CONF, ctx) == "correct"
    # stating the gold wins even without evidence
    assert error_category("It is $1,200.", GOLD, CONF, "") == "correct"
    # ... but not when the confounder is named too: the rule reads no negation, this is a hedge
    assert not answer_correct("$1,200, not $900", GOLD, CONF)
    assert error_category("$1,200, not $900", GOLD, CONF, "") == "hedge"


def test_confounder_answered_is_trajectory_confusion():
    ctx = "[PrimaryPath]\nAnna's travel budget is $1,200.\n[Supplemental]\nBen's agenda budget is $900."
    assert error_category("The budget is $900.", GOLD, CONF, ctx) == "trajectory_confusion"
    # rule 2 comes before rule 3: the gold missing from the context does not matter
    assert error_category("$900", GOLD, CONF, "[PrimaryPath]\nBen's budget is $900.") == "trajectory_confusion"


def test_retrieval_failure():
    ctx = "[PrimaryPath]\nWe booked the hotel."
    assert error_category("I don't know.", GOLD, CONF, ctx) == "retrieval_failure"
    # only the confounder reached the context, but the prediction did not name it: retrieval failure
    ctx = "[PrimaryPath]\nBen's agenda budget is $900."
    assert error_category("I don't know.", GOLD, CONF, ctx) == "retrieval_failure"
    # "$12,000" in the context is not the gold "$1,200"
    ctx = "[PrimaryPath]\nThe project budget is $12,000."
    assert error_category("No idea.", GOLD, CONF, ctx) == "retrieval_failure"


def test_confounder_present_and_preferred_is_trajectory_confusion():
    # confounder on line 1, gold on line 3 -> the confounder has priority
    ctx = "[PrimaryPath]\nBen's agenda budget is $900.\n[AtomicFacts]\nAnna's travel budget is $1,200."
    assert error_category("Not sure.", GOLD, CONF, ctx) == "trajectory_confusion"
    # same line: the confounder's offset is smaller
    ctx = "[PrimaryPath]\nBen has $900 and Anna has $1,200."
    assert error_category("Not sure.", GOLD, CONF, ctx) == "trajectory_confusion"


def test_other():
    # gold before the confounder, prediction names neither
    ctx = "[PrimaryPath]\nAnna's travel budget is $1,200.\n[Supplemental]\nBen's agenda budget is $900."
    assert error_category("Not sure.", GOLD, CONF, ctx) == "other"
    # gold only
    assert error_category("Not sure.", GOLD, CONF, "[PrimaryPath]\nAnna: $1,200") == "other"
    # no confounder at all
    assert error_category("Not sure.", GOLD, None, "[PrimaryPath]\nAnna: $1,200") == "other"
    assert ERROR_CATEGORIES == ("correct", "hedge", "retrieval_failure", "trajectory_confusion", "other")


def test_values_do_not_match_across_lines():
    # "June" ends one line and "3" starts the next: not an occurrence of "June 3"
    ctx = "[PrimaryPath]\nWe fly in June\n3 bags are packed"
    assert context_flags(ctx, "June 3", "June 30") == {"gold_in_context": False, "confounder_in_context": False}


def test_context_flags():
    ctx = "[PrimaryPath]\nBen's agenda budget is $900.\n[AtomicFacts]\nAnna's travel budget is $1,200."
    assert context_flags(ctx, GOLD, CONF) == {"gold_in_context": True, "confounder_in_context": True}
    assert context_flags("[PrimaryPath]\n$12,000", GOLD, CONF) == {
        "gold_in_context": False,
        "confounder_in_context": False,
    }
    assert context_flags("$1,200", GOLD, None) == {"gold_in_context": True, "confounder_in_context": False}
    # the gold "Maria" only occurs inside the confounder "Maria Lopez"
    assert context_flags("Coach: Maria Lopez", "Maria", "Maria Lopez") == {
        "gold_in_context": False,
        "confounder_in_context": True,
    }
    # and the other way round: confounder "Maria" inside gold "Maria Lopez"
    assert context_flags("Coach: Maria Lopez", "Maria Lopez", "Maria") == {
        "gold_in_context": True,
        "confounder_in_context": False,
    }


def test_context_object_searches_blocks_not_header():
    ctx = Context(
        blocks=[
            Block("PrimaryPath", lines=["Ben's conference is on June 30."]),
            Block("Supplemental", lines=[]),  # empty blocks are not rendered
        ],
        header="Current time: June 3",
        tokens=0,
        budget=0,
        intents=set(),
    )
    # the header mentions "June 3" but is not evidence
    assert context_flags(ctx, "June 3", "June 30") == {"gold_in_context": False, "confounder_in_context": True}
    assert error_category("I don't know.", "June 3", "June 30", ctx) == "retrieval_failure"
    # the rendered text includes the header: there the gold is found (line 0) before the confounder
    assert error_category("I don't know.", "June 3", "June 30", ctx.text) == "other"


# --------------------------------------------------------------------------------------------------
# aggregate


def test_aggregate_branchmem_records():
    records = [
        {"correct": True, "dimension": "interleaving", "question_type": "update_current", "error": "correct"},
        {"correct": False, "dimension": "interleaving", "question_type": "update_previous",
         "error": "trajectory_confusion"},
        {"correct": True, "dimension": "delayed_resumption", "question_type": "delayed_fact", "error": "correct"},
        {"correct": False, "dimension": "parallel_confusion", "question_type": "parallel_fact",
         "error": "retrieval_failure"},
        {"correct": True, "dimension": "interleaving", "question_type": "update_current", "error": "correct"},
    ]
    out = aggregate(records, ["dimension", "question_type"])
    # 3 correct of 5
    assert out["n"] == 5
    assert out["accuracy"] == pytest.approx(0.6)
    assert out["errors"] == {"correct": 3, "retrieval_failure": 1, "trajectory_confusion": 1}

    dim = out["by"]["dimension"]
    assert list(dim["groups"]) == ["delayed_resumption", "interleaving", "parallel_confusion"]  # sorted
    # interleaving: 2 of 3; delayed_resumption: 1 of 1; parallel_confusion: 0 of 1
    assert dim["groups"]["interleaving"] == {
        "n": 3, "accuracy": pytest.approx(2 / 3), "errors": {"correct": 2, "trajectory_confusion": 1}}
    assert dim["groups"]["delayed_resumption"]["accuracy"] == 1.0
    assert dim["groups"]["parallel_confusion"]["accuracy"] == 0.0
    # macro = (2/3 + 1 + 0) / 3 = 5/9
    assert dim["macro_accuracy"] == pytest.approx(5 / 9)

    qt = out["by"]["question_type"]
    # update_current 2/2 = 1, update_previous 0/1, delayed_fact 1/1, parallel_fact 0/1 -> macro 2/4
    assert qt["groups"]["update_current"]["n"] == 2
    assert qt["groups"]["update_current"]["accuracy"] == 1.0
    assert qt["macro_accuracy"] == pytest.approx(0.5)


def test_aggregate_locomo_scores():
    records = [
        {"score": 1.0, "category": 1},
        {"score": 0.5, "category": 1},
        {"score": 0.25, "category": 4},
        {"score": 0.0, "category": 4, "correct": True},  # "score" wins over "correct"
        {"score": 0.75},  # no category: counted overall, not in any group
    ]
    out = aggregate(records, ["category"])
    # overall (1 + 0.5 + 0.25 + 0 + 0.75) / 5 = 2.5 / 5 = 0.5
    assert out["accuracy"] == pytest.approx(0.5)
    assert out["errors"] == {}
    groups = out["by"]["category"]["groups"]
    assert list(groups) == [1, 4]
    # category 1: (1 + 0.5) / 2 = 0.75 ; category 4: (0.25 + 0) / 2 = 0.125
    assert groups[1]["accuracy"] == pytest.approx(0.75)
    assert groups[4]["accuracy"] == pytest.approx(0.125)
    assert groups[1]["n"] + groups[4]["n"] == 4
    # macro = (0.75 + 0.125) / 2 = 0.4375
    assert out["by"]["category"]["macro_accuracy"] == pytest.approx(0.4375)


def test_aggregate_empty_and_invalid():
    out = aggregate([], ["dimension"])
    assert out == {"n": 0, "accuracy": None, "errors": {},
                   "by": {"dimension": {"groups": {}, "macro_accuracy": None}}}
    with pytest.raises(ValueError, match="neither"):
        aggregate([{"dimension": "x"}], ["dimension"])


def test_answer_token_recall_counts_the_gold_tokens_the_context_holds():
    from arbor_train.scoring.answers import answer_token_recall

    ctx = "[1:56 pm on 8 May, 2023] Caroline: I went to the LGBTQ support group on 7 May 2023."
    assert answer_token_recall(ctx, "7 May 2023") == 1.0
    assert answer_token_recall(ctx, "Adoption agencies") == 0.0
    assert answer_token_recall("She researched adoption.", "Adoption agencies") == 0.5
    # a multiset: the gold's two "red" need two in the context; the article is dropped; stems match
    assert answer_token_recall("a red car", "the red red cars") == 2 / 3
    assert answer_token_recall(ctx, "") is None and answer_token_recall(ctx, "the") is None
