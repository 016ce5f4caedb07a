"""LongMemEval and BEAM loaders on hand-written fixtures, and their error messages on bad input."""

import copy
import json
import shutil
from pathlib import Path

import pytest

from arbor_train.conversations.beam import load_beam, load_beam_dir
from arbor_train.conversations.longmemeval import infer_variant, load_longmemeval
from arbor_train.conversations.schema import BenchmarkFormatError, Conversation, interactions

FIX = Path(__file__).parent / "fixtures" / "benchmarks"
LME = FIX / "longmemeval_s_tiny.json"
BEAM = FIX / "beam"


# ------------------------------------------------------------------------------------------ LongMemEval


@pytest.fixture(scope="module")
def lme():
    return load_longmemeval(LME)


def test_lme_counts_ids_and_sessions(lme):
    assert [c.conversation_id for c in lme] == ["e47becba", "6a1eabeb", "gpt4_2f8be40d_abs"]
    assert all(c.speakers == ["user", "assistant"] for c in lme)
    assert all(c.meta["variant"] == "s" for c in lme)
    assert [len(c.sessions) for c in lme] == [2, 3, 2]
    assert [len(c.questions) for c in lme] == [1, 1, 1]
    assert sum(len(s.turns) for c in lme for s in c.sessions) == 6 + 7 + 4

    c = lme[0]
    assert [s.session_id for s in c.sessions] == ["sharegpt_yhk3_0", "answer_280352e9"]
    assert [s.date_time for s in c.sessions] == ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 14:03"]
    t = c.sessions[1].turns
    assert [x.turn_id for x in t] == [f"answer_280352e9:{i}" for i in range(4)]
    assert [x.speaker for x in t] == ["user", "assistant", "user", "assistant"]
    assert [x.has_answer for x in t] == [True, False, False, False]
    assert t[0].text.startswith("I graduated with a degree in Business Administration")


def test_lme_questions(lme):
    q0, q1, q2 = (c.questions[0] for c in lme)
    assert (q0.question_id, q0.category, q0.answer) == ("e47becba", "single-session-user", "Business Administration")
    assert q0.evidence == ["answer_280352e9:0"]
    assert q0.question_date == "2023/05/30 (Tue) 23:40"
    assert q0.extra == {"abstention": False, "answer_session_ids": ["answer_280352e9"]}

    assert q1.category == "knowledge-update"
    assert q1.evidence == ["answer_ku_1:0", "answer_ku_2:0"]  # has_answer: false is not evidence
    assert q1.extra["answer_session_ids"] == ["answer_ku_1", "answer_ku_2"]
    assert q1.extra["abstention"] is False

    assert q2.category == "temporal-reasoning"
    assert q2.extra["abstention"] is True
    assert q2.evidence == ["answer_tr_abs_1:0"]
    assert q2.answer.startswith("The information provided is not enough")
    assert all(e in c.turn_ids() for c in lme for q in c.questions for e in q.evidence)


def test_lme_interactions_pair_user_and_assistant(lme):
    inter = interactions(lme[1])
    assert [i.turn_ids for i in inter] == [
        ["answer_ku_1:0", "answer_ku_1:1"], ["ultrachat_5521:0", "ultrachat_5521:1"],
        ["answer_ku_2:0", "answer_ku_2:1"], ["answer_ku_2:2"]]
    assert inter[0].user.startswith("I just ran a 5K") and inter[0].assistant.startswith("Congratulations")
    assert inter[0].timestamp == "2023/04/02 (Sun) 08:00" and inter[0].session_id == "answer_ku_1"
    assert inter[-1].assistant == ""


def test_lme_round_trip(lme):
    for c in lme:
        d = json.loads(json.dumps(c.to_json()))
        assert Conversation.from_json(d) == c


def test_lme_variant(tmp_path):
    assert infer_variant("longmemeval_s_cleaned.json") == "s"
    assert infer_variant("/x/longmemeval_m.json") == "m"
    assert infer_variant("longmemeval_oracle.json") == "oracle"
    assert infer_variant("data.json") is None
    p = tmp_path / "longmemeval_oracle.json"
    shutil.copy(LME, p)
    assert {c.meta["variant"] for c in load_longmemeval(p)} == {"oracle"}
    assert {c.meta["variant"] for c in load_longmemeval(LME, variant="m")} == {"m"}


def _lme_raw():
    return json.loads(LME.read_text())


def _write(tmp_path, data, name="longmemeval_s_bad.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_lme_file_errors(tmp_path):
    with pytest.raises(BenchmarkFormatError, match=r"longmemeval_s_missing\.json.*not found"):
        load_longmemeval(tmp_path / "longmemeval_s_missing.json")
    with pytest.raises(BenchmarkFormatError, match=r"longmemeval_s_bad\.json.*not valid JSON"):
        load_longmemeval(_write(tmp_path, "[{"))
    with pytest.raises(BenchmarkFormatError, match=r"longmemeval_s_bad\.json.*list of instances.*dict"):
        load_longmemeval(_write(tmp_path, {"question_id": "x"}))


@pytest.mark.parametrize("field", ["question_id", "question_type", "question", "answer", "question_date",
                                   "haystack_session_ids", "haystack_dates", "haystack_sessions"])
def test_lme_missing_field(tmp_path, field):
    data = _lme_raw()
    del data[1][field]
    qid = "" if field == "question_id" else r" \(question_id='6a1eabeb'\)"
    with pytest.raises(BenchmarkFormatError, match=rf"longmemeval_s_bad\.json: instance 1{qid}: missing required "
                                                   rf"field '{field}'"):
        load_longmemeval(_write(tmp_path, data))


def test_lme_length_mismatch(tmp_path):
    data = _lme_raw()
    data[2]["haystack_dates"].pop()
    with pytest.raises(BenchmarkFormatError, match=r"longmemeval_s_bad\.json: instance 2 \(question_id="
                                                   r"'gpt4_2f8be40d_abs'\).*haystack_session_ids=2, "
                                                   r"haystack_dates=1, haystack_sessions=2"):
        load_longmemeval(_write(tmp_path, data))


def test_lme_unknown_question_type(tmp_path):
    data = _lme_raw()
    data[0]["question_type"] = "single-hop"
    with pytest.raises(BenchmarkFormatError, match=r"longmemeval_s_bad\.json: instance 0.*'question_type'.*"
                                                   r"'single-hop'"):
        load_longmemeval(_write(tmp_path, data))


@pytest.mark.parametrize("field", ["role", "content"])
def test_lme_message_missing_field(tmp_path, field):
    data = _lme_raw()
    del data[1]["haystack_sessions"][2][1][field]
    with pytest.raises(BenchmarkFormatError, match=rf"longmemeval_s_bad\.json: instance 1.*session 'answer_ku_2' "
                                                   rf"message 1: missing field '{field}'"):
        load_longmemeval(_write(tmp_path, data))


# ------------------------------------------------------------------------------------------------ BEAM


@pytest.fixture(scope="module")
def beam():
    return load_beam_dir(BEAM)


def test_beam_dir_and_sessions(beam):
    a, b = beam
    assert [c.conversation_id for c in beam] == ["conv_a", "conv_b"]
    assert a.speakers == b.speakers == ["user", "assistant"]
    assert (a.meta["layout"], b.meta["layout"]) == ("batches", "plans")

    assert [s.session_id for s in a.sessions] == ["batch1", "batch2"]
    # batch 2 has time_anchor null: the first message's anchor is used
    assert [s.date_time for s in a.sessions] == ["March-15-2024", "March-29-2024"]
    assert [[t.turn_id for t in s.turns] for s in a.sessions] == [["0", "1", "2", "3"], ["4", "5"]]
    assert [t.speaker for _, t in a.turns()] == ["user", "assistant"] * 3
    assert a.sessions[1].turns[0].text.startswith("Update: we moved the deadline")

    assert [s.session_id for s in b.sessions] == ["plan1-batch1", "plan2-batch1"]
    assert [s.date_time for s in b.sessions] == ["January-05-2024", "February-20-2024"]
    assert [[t.turn_id for t in s.turns] for s in b.sessions] == [["0", "1", "2", "3"], ["4", "5"]]


def test_beam_questions_dict_layout(beam):
    a = beam[0]
    assert [q.question_id for q in a.questions] == [
        "information_extraction:0", "knowledge_update:0", "event_ordering:0", "instruction_following:0",
        "abstention:0"]
    qs = {q.question_id: q for q in a.questions}
    assert [q.category for q in a.questions] == [q.question_id.split(":")[0] for q in a.questions]

    ie = qs["information_extraction:0"]
    assert (ie.answer, ie.evidence) == ("Tasker", ["0"])
    assert ie.extra == {"difficulty": "easy", "rubric": ["LLM response should state: Tasker"]}

    ku = qs["knowledge_update:0"]
    assert ku.answer == "May 10" and ku.evidence == ["0", "4"]
    assert ku.extra["source_chat_ids"] == {"original_info": [0], "updated_info": [4]}
    assert len(ku.extra["rubric"]) == 2

    eo = qs["event_ordering:0"]
    assert eo.answer == str(["Chose SQLite", "Switched to PostgreSQL"])
    assert eo.extra["answer"] == ["Chose SQLite", "Switched to PostgreSQL"]
    assert eo.evidence == ["2", "4"]

    inf = qs["instruction_following:0"]
    assert inf.answer.startswith("A Python function with type hints")
    assert inf.extra["instruction_being_tested"] == "Always include type hints in code examples."
    assert "ideal_response" not in inf.extra

    ab = qs["abstention:0"]
    assert ab.evidence == [] and ab.answer.startswith("Based on the chat")
    assert ab.extra["why_unanswerable"] == "The cloud provider was never mentioned."
    assert all(q.question_date is None for q in a.questions)


def test_beam_questions_string_literal_layout(beam):
    b = beam[1]
    assert [q.question_id for q in b.questions] == [
        "information_extraction:0", "knowledge_update:0", "preference_following:0", "summarization:0"]
    qs = {q.question_id: q for q in b.questions}
    assert qs["knowledge_update:0"].evidence == ["2", "4"]
    assert qs["preference_following:0"].answer.startswith("A dairy-free breakfast")
    assert qs["preference_following:0"].extra["preference_being_tested"] == "never eats dairy"
    assert qs["summarization:0"].answer.startswith("Training for Berlin")
    assert qs["summarization:0"].evidence == ["0", "2", "4"]
    assert qs["summarization:0"].extra == {"difficulty": "hard",
                                           "rubric": ["mentions Berlin", "mentions five days a week"]}


def test_beam_interactions_and_round_trip(beam):
    inter = interactions(beam[1])
    assert [i.turn_ids for i in inter] == [["0", "1"], ["2", "3"], ["4", "5"]]
    assert [i.session_id for i in inter] == ["plan1-batch1", "plan1-batch1", "plan2-batch1"]
    assert inter[2].timestamp == "February-20-2024"
    assert inter[0].user.startswith("I'm training") and inter[0].assistant.startswith("Let's build")
    for c in beam:
        assert Conversation.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_load_beam_single_and_default_id():
    c = load_beam(BEAM / "conv_a" / "chat.json", BEAM / "conv_a" / "probing_questions.json")
    assert c.conversation_id == "conv_a"
    c = load_beam(BEAM / "conv_a" / "chat.json", BEAM / "conv_a" / "probing_questions.json", conversation_id="x")
    assert c.conversation_id == "x"


def _beam_copy(tmp_path, name="conv_a"):
    d = tmp_path / "beam" / name
    shutil.copytree(BEAM / name, d)
    return d


def _chat(d):
    return json.loads((d / "chat.json").read_text())


def _probing(d):
    return json.loads((d / "probing_questions.json").read_text())


def _load(d):
    return load_beam(d / "chat.json", d / "probing_questions.json")


def test_beam_file_errors(tmp_path):
    d = _beam_copy(tmp_path)
    (d / "probing_questions.json").unlink()
    with pytest.raises(BenchmarkFormatError, match=r"probing_questions\.json.*not found"):
        _load(d)
    (d / "chat.json").write_text("[{")
    with pytest.raises(BenchmarkFormatError, match=r"chat\.json: not valid JSON"):
        _load(d)
    (d / "chat.json").write_text('{"batch_number": 1}')
    with pytest.raises(BenchmarkFormatError, match=r"chat\.json: expected a JSON list of batches"):
        _load(d)
    with pytest.raises(BenchmarkFormatError, match=r"nope.*not found"):
        load_beam_dir(tmp_path / "nope")
    with pytest.raises(BenchmarkFormatError, match=r"chat\.json"):
        load_beam_dir(tmp_path / "beam")


@pytest.mark.parametrize("field", ["batch_number", "turns"])
def test_beam_batch_missing_field(tmp_path, field):
    d = _beam_copy(tmp_path)
    chat = _chat(d)
    del chat[1][field]
    (d / "chat.json").write_text(json.dumps(chat))
    where = r"batch at position 1" if field == "batch_number" else r"batch 2"
    with pytest.raises(BenchmarkFormatError, match=rf"chat\.json: {where}: missing field '{field}'"):
        _load(d)


@pytest.mark.parametrize("field", ["role", "id", "content"])
def test_beam_message_missing_field(tmp_path, field):
    d = _beam_copy(tmp_path)
    chat = _chat(d)
    del chat[0]["turns"][1][0][field]
    (d / "chat.json").write_text(json.dumps(chat))
    with pytest.raises(BenchmarkFormatError, match=rf"chat\.json: batch 1: turns\[1\]\[0\]: missing field '{field}'"):
        _load(d)


def test_beam_plan_layout_error_names_plan(tmp_path):
    d = _beam_copy(tmp_path, "conv_b")
    chat = _chat(d)
    del chat[1]["plan-2"][0]["turns"][0][1]["content"]
    (d / "chat.json").write_text(json.dumps(chat))
    with pytest.raises(BenchmarkFormatError, match=r"chat\.json: plan2-batch 1: turns\[0\]\[1\]: missing field "
                                                   r"'content'"):
        _load(d)


def test_beam_unknown_ability(tmp_path):
    d = _beam_copy(tmp_path)
    pq = _probing(d)
    pq["multi_hop"] = copy.deepcopy(pq["abstention"])
    (d / "probing_questions.json").write_text(json.dumps(pq))
    with pytest.raises(BenchmarkFormatError, match=r"probing_questions\.json: unknown ability 'multi_hop'"):
        _load(d)


def test_beam_unknown_source_chat_id(tmp_path):
    d = _beam_copy(tmp_path)
    pq = _probing(d)
    pq["event_ordering"][0]["source_chat_ids"] = [2, 99]
    (d / "probing_questions.json").write_text(json.dumps(pq))
    with pytest.raises(BenchmarkFormatError, match=r"probing_questions\.json: ability 'event_ordering' item 0 "
                                                   r"\(event_ordering:0\): field 'source_chat_ids' names id '99'"):
        _load(d)


@pytest.mark.parametrize("field", ["question", "rubric"])
def test_beam_item_missing_field(tmp_path, field):
    d = _beam_copy(tmp_path)
    pq = _probing(d)
    del pq["knowledge_update"][0][field]
    (d / "probing_questions.json").write_text(json.dumps(pq))
    with pytest.raises(BenchmarkFormatError, match=rf"probing_questions\.json: ability 'knowledge_update' item 0 "
                                                   rf"\(knowledge_update:0\): missing field '{field}'"):
        _load(d)


def test_beam_string_literal_is_never_executed(tmp_path):
    d = _beam_copy(tmp_path, "conv_b")
    marker = tmp_path / "pwned"
    (d / "probing_questions.json").write_text(json.dumps(f"__import__('pathlib').Path({str(marker)!r}).touch()"))
    with pytest.raises(BenchmarkFormatError, match=r"probing_questions\.json: top-level value: string is neither"):
        _load(d)
    assert not marker.exists()
    # a per-ability string value (the hub's column layout) is parsed as a literal too
    pq = {"information_extraction": repr([{"question": "q?", "answer": 7, "rubric": ["r"], "source_chat_ids": [0]}])}
    (d / "probing_questions.json").write_text(json.dumps(pq))
    q = _load(d).questions[0]
    assert (q.question_id, q.answer, q.evidence, q.extra["answer"]) == ("information_extraction:0", "7", ["0"], 7)


# ----------------------------------------------------------------------------- strict types (issue #14)


def _lme_mutated(mutate):
    data = _lme_raw()
    mutate(data)
    return data


@pytest.mark.parametrize("mutate, msg", [
    # a string where a boolean belongs was taken as true: "false" made a turn evidence
    (lambda d: d[1]["haystack_sessions"][2][1].update(has_answer="false"),
     r"instance 1 \(question_id='6a1eabeb'\): session 'answer_ku_2' message 1: field 'has_answer' must be true or "
     r"false, got 'false'"),
    # a null question became the text "None"
    (lambda d: d[0].update(question=None), r"instance 0 \(question_id='e47becba'\): field 'question' must be a "
                                           r"string, got null"),
    (lambda d: d[2].update(question_id=7), r"instance 2 \(question_id=7\): field 'question_id' must be a string"),
    (lambda d: d[0]["haystack_session_ids"].__setitem__(1, None), r"instance 0 .*field 'haystack_session_ids\[1\]' "
                                                                   r"must be a string, got null"),
    (lambda d: d[2].update(question_id=d[0]["question_id"], question_type=d[0]["question_type"]),
     r"longmemeval_s_bad\.json: duplicate question_id 'e47becba' at instance 0 and instance 2"),
    (lambda d: d[1]["haystack_sessions"][0][0].update(content="bad \ud800 text"),
     r"instance 1 .*session 'answer_ku_1' message 0: field 'content' is not valid UTF-8 text"),
    (lambda d: d[0].update(answer=True), r"instance 0 .*field 'answer' must be a string, got bool"),
])
def test_lme_strict_types_duplicates_and_text(tmp_path, mutate, msg):
    with pytest.raises(BenchmarkFormatError, match=msg):
        load_longmemeval(_write(tmp_path, _lme_mutated(mutate)))


def test_lme_integer_answers_and_repeated_sessions_stay_accepted(tmp_path):
    """What the release does (answers that are numbers; 13 LongMemEval-S histories hold one filler session
    twice) still loads as before."""
    data = _lme_raw()
    data[0]["answer"] = 3
    data[1]["haystack_session_ids"][1] = data[1]["haystack_session_ids"][0]
    convs = load_longmemeval(_write(tmp_path, data))
    assert convs[0].questions[0].answer == "3"
    assert [s.session_id for s in convs[1].sessions][:2] == ["answer_ku_1", "answer_ku_1"]


@pytest.mark.parametrize("where, mutate, msg", [
    ("chat", lambda c, p: c[1]["turns"][0][1].update(id=1),
     r"chat\.json: duplicate message id '1' at batch1 message 1 and batch2 message 1"),
    ("chat", lambda c, p: c[1].update(batch_number=1), r"chat\.json: duplicate batch 'batch1' at batch position 0 "
                                                       r"and batch position 1"),
    ("chat", lambda c, p: c[0]["turns"][0][0].update(id=None), r"chat\.json: batch 1: turns\[0\]\[0\]: field 'id' "
                                                               r"must be an integer or a string, got null"),
    ("chat", lambda c, p: c[0]["turns"][1][1].update(content="x\udfff"),
     r"chat\.json: batch 1: turns\[1\]\[1\] \(id 3\): field 'content' is not valid UTF-8 text"),
    ("chat", lambda c, p: c[0]["turns"][0][1].update(role=None), r"turns\[0\]\[1\] \(id 1\): field 'role' must be a "
                                                                 r"string, got null"),
    ("probing", lambda c, p: p["knowledge_update"][0].update(question=None),
     r"probing_questions\.json: ability 'knowledge_update' item 0 \(knowledge_update:0\): field 'question' must be "
     r"a string, got null"),
    ("probing", lambda c, p: p["abstention"][0].update(answer=False), r"ability 'abstention' item 0 .*field 'answer'"),
])
def test_beam_strict_types_duplicates_and_text(tmp_path, where, mutate, msg):
    d = _beam_copy(tmp_path)
    chat, pq = _chat(d), _probing(d)
    mutate(chat, pq)
    (d / "chat.json").write_text(json.dumps(chat))
    (d / "probing_questions.json").write_text(json.dumps(pq))
    with pytest.raises(BenchmarkFormatError, match=msg):
        _load(d)
