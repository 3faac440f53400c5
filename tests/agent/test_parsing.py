"""parse_reply: a table of adversarial replies with exact results, big inputs, properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen import envs
from ragen.agent.parsing import FATAL, PROBLEMS, Parsed, action_word_problem, parse_reply

GRID = ("Up", "Down", "Left", "Right")
# The cube's Singmaster turns: the prime (') is part of the word and must survive.
CUBE = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")


def case(text, actions, problems=(), *, think_text="", answer="", k=3, valid=GRID, think=True):
    """One table row: the reply, then what parse_reply must return for it."""
    return pytest.param(text, valid, k, think, think_text, answer, actions, problems, id=text[:60])


CASES = [
    # Well-formed replies.
    case("<think>box is left</think><answer>Left || Up</answer>", ("Left", "Up"),
         think_text="box is left", answer="Left || Up"),
    case("<think>\n a \n</think>\n\n<answer> Up </answer>\n", ("Up",), think_text="a", answer="Up"),
    case("<THINK>x</Think><Answer>up</ANSWER>", ("Up",), think_text="x", answer="up"),
    # Lenient separators, strict words; canonical spelling; trailing punctuation.
    case("<think>t</think><answer>up|DOWN, left\nright</answer>", ("Up", "Down", "Left"),
         ("extra_actions",), think_text="t", answer="up|DOWN, left\nright"),
    case("<think>t</think><answer>Up. ; Left!</answer>", ("Up", "Left"),
         think_text="t", answer="Up. ; Left!"),
    case("<think>t</think><answer>Up || || Down ||</answer>", ("Up", "Down"),
         think_text="t", answer="Up || || Down ||"),
    case("<think>t</think><answer>Up Down</answer>", (), ("unknown_action",),
         think_text="t", answer="Up Down"),
    case("<think>t</think><answer>Go up || Jump || Left</answer>", ("Left",), ("unknown_action",),
         think_text="t", answer="Go up || Jump || Left"),
    case("<think>t</think><answer>**Up**</answer>", (), ("unknown_action",),
         think_text="t", answer="**Up**"),
    case("<think>t</think><answer>Up || Up || Up || Up || Up</answer>", ("Up", "Up"),
         ("extra_actions",), think_text="t", answer="Up || Up || Up || Up || Up", k=2),
    # Missing, empty and unclosed blocks: nothing runs.
    case("<think>t</think>", (), ("missing_answer",), think_text="t"),
    case("<think>t</think> Left", (), ("missing_answer", "text_outside_tags"), think_text="t"),
    case("<think>t</think><answer></answer>", (), ("empty_answer",), think_text="t"),
    case("<think>t</think><answer> || , </answer>", (), ("empty_answer",),
         think_text="t", answer="|| ,"),
    case("<think>t</think><answer>Up || Le", (), ("unclosed_answer",),
         think_text="t", answer="Up || Le"),
    case("<think>I go <answer>Up</answer>", (), ("unclosed_think",),
         think_text="I go <answer>Up</answer>"),
    case("<answer>Up</answer>", (), ("missing_think",), answer="Up"),
    case("", (), ("missing_think", "missing_answer")),
    case("Up", (), ("missing_think", "missing_answer", "text_outside_tags")),
    case("</think><answer>Up</answer>", (), ("missing_think", "text_outside_tags"), answer="Up"),
    # Chatter around the blocks is reported but does not cost the actions.
    case("Sure! <think>t</think><answer>Up</answer>", ("Up",), ("text_outside_tags",),
         think_text="t", answer="Up"),
    case("<think>t</think>So:<answer>Up</answer>Done.", ("Up",), ("text_outside_tags",),
         think_text="t", answer="Up"),
    case("<think>t</think><answer>Up</answer><answer>Down</answer>", ("Up",), ("repeated_answer",),
         think_text="t", answer="Up"),
    case("<think>a</think><think>b</think><answer>Down</answer>", ("Down",), ("repeated_think",),
         think_text="a", answer="Down"),
    # Nested tags: the think block ends at the first </think>; the answer comes after it.
    case("<think><think>a</think><answer>Up</answer>", ("Up",), ("nested_tag",),
         think_text="<think>a", answer="Up"),
    case("<think>say <answer>Up</answer></think><answer>Down</answer>", ("Down",), ("nested_tag",),
         think_text="say <answer>Up</answer>", answer="Down"),
    case("<think>t</think><answer>Up <answer>Down</answer>", (), ("nested_tag", "unknown_action"),
         think_text="t", answer="Up <answer>Down"),
    # Unicode and NUL bytes are just characters.
    case("<think>箱子在左边 ☃\x00</think><answer>left。</answer>", ("Left",),
         think_text="箱子在左边 ☃\x00", answer="left。"),
    case("\x00<think>t</think><answer>Up\x00</answer>", (), ("text_outside_tags", "unknown_action"),
         think_text="t", answer="Up\x00"),
    case("<think>İstanbul</think><answer>UP</answer>", ("Up",), think_text="İstanbul", answer="UP"),
    # NoThinking ablation: the reply starts with <answer>; a think block is chatter there.
    case("<answer>Left || Down</answer>", ("Left", "Down"), answer="Left || Down", think=False),
    case("<think>t</think><answer>Up</answer>", ("Up",), ("repeated_think",),
         answer="Up", think=False),
    case("<answer>Left", (), ("unclosed_answer",), answer="Left", think=False),
    case("Left", (), ("missing_answer", "text_outside_tags"), think=False),
    # Free-text env: the whole answer is the action, never split, never unknown.
    case("<think>t</think><answer> (7 - 2) * 3 </answer>", ("(7 - 2) * 3",),
         think_text="t", answer="(7 - 2) * 3", valid=()),
    case("<think>t</think><answer>1 | 2, 3</answer>", ("1 | 2, 3",),
         think_text="t", answer="1 | 2, 3", valid=(), k=1),
    case("<think>t</think><answer> </answer>", (), ("empty_answer",), think_text="t", valid=()),
    # A Sudoku move is free text: its commas separate nothing; the env reads the move.
    case("<think>t</think><answer> (2, 3,5) </answer>", ("(2, 3,5)",),
         think_text="t", answer="(2, 3,5)", valid=(), k=2),
    # Cube turns: the prime survives case folding and trailing punctuation; a Singmaster
    # sequence written with spaces, a typographic prime, a half turn or Ri is no turn.
    case("<think>t</think><answer>R' || u' || F</answer>", ("R'", "U'", "F"),
         think_text="t", answer="R' || u' || F", valid=CUBE),
    case("<think>t</think><answer>B'. ; d'!</answer>", ("B'", "D'"),
         think_text="t", answer="B'. ; d'!", valid=CUBE),
    case("<think>t</think><answer>R U R' U'</answer>", (), ("unknown_action",),
         think_text="t", answer="R U R' U'", valid=CUBE),
    case("<think>t</think><answer>R’ || R2 || Ri || U'' || 'U || R</answer>", ("R",),
         ("unknown_action",), think_text="t", answer="R’ || R2 || Ri || U'' || 'U || R",
         valid=CUBE),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "valid", "k", "think", "think_text", "answer", "actions", "problems"), CASES
)
def test_adversarial_table(text, valid, k, think, think_text, answer, actions, problems):
    parsed = parse_reply(text, valid, k, think=think)
    assert parsed.actions == actions
    assert parsed.think == think_text
    assert parsed.answer == answer
    assert parsed.problems == problems
    assert parsed.format_ok == bool(actions)


def test_counts_of_dropped_words():
    parsed = parse_reply(
        "<think>t</think><answer>Up || Fly || Down || Left || ??? || Right</answer>", GRID, 2
    )
    assert parsed == Parsed(
        think="t",
        answer="Up || Fly || Down || Left || ??? || Right",
        actions=("Up", "Down"),
        format_ok=True,
        problems=("unknown_action", "extra_actions"),
        unknown_actions=2,
        extra_actions=2,
    )


def test_all_unknown_words_mean_no_action_and_format_not_ok():
    parsed = parse_reply("<think>t</think><answer>North || South</answer>", GRID, 3)
    assert (parsed.actions, parsed.format_ok, parsed.unknown_actions) == ((), False, 2)


def test_an_action_word_ending_in_punctuation_still_matches_exactly():
    parsed = parse_reply("<think>t</think><answer>go! || stop</answer>", ("Go!", "Stop"), 2)
    assert parsed.actions == ("Go!", "Stop")


def test_max_actions_below_one_is_a_caller_error():
    with pytest.raises(ValueError, match="max_actions must be >= 1, got 0"):
        parse_reply("<think>t</think><answer>Up</answer>", GRID, 0)


def test_every_problem_code_is_documented_and_fatal_codes_are_codes():
    assert set(PROBLEMS) >= FATAL
    reported = {code for row in CASES for code in row.values[-1]}
    assert reported == set(PROBLEMS)  # the table exercises every code


# 400 KB inputs built from the fragments that trip naive parsers. A parser that rescans the
# text per tag, like re.search(r"<think>(.*?)</think>...") on "<think>" * 57_000, takes
# minutes on these (about 1 s at 28 KB, growing with the square); the suite's own run time
# is the guard, no clock is read here.
BIG = 400_000
HUGE_INPUTS = [
    "<think>" * (BIG // 7),
    "<think></think>" + "<answer>" * (BIG // 8),
    "<think>t</think><answer>" + "Up || " * (BIG // 6) + "</answer>",
    "<think>t</think><answer>" + "|" * BIG + "</answer>",
    "<think>t</think><answer>x</answer>" + "<answer>" * (BIG // 8),
    "<think></think><answer></answer>" * (BIG // 32),
    "\x00" * BIG,
    "<thi" * (BIG // 4) + "<answer>Up</answer>",
    "<think>" + "</thin" * (BIG // 6) + "</think><answer>Up" + "." * BIG + "</answer>",
]


@pytest.mark.parametrize("text", HUGE_INPUTS, ids=lambda t: repr(t[:24]))
def test_huge_adversarial_inputs_parse(text):
    parsed = parse_reply(text, GRID, 5)
    assert len(parsed.actions) <= 5


def test_huge_inputs_give_exact_results():
    many_ups = "<think>t</think><answer>" + "Up || " * 1000 + "</answer>"
    assert parse_reply(many_ups, GRID, 5).extra_actions == 995
    junk_tail = "<think>" + "</thin" * 1000 + "</think><answer>Up" + "." * 1000 + "</answer>"
    assert parse_reply(junk_tail, GRID, 5).actions == ("Up",)
    think_only = parse_reply("<think>" * 1000, GRID, 5)
    assert (think_only.think, think_only.problems) == ("<think>" * 999, ("unclosed_think",))


# Hypothesis: replies assembled from tags, action words in any case, separators and junk.
FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "<Answer>", "</THINK>", "||", "|", ",",
     "\n", " ", ".", "Up", "down", "LEFT", "Right!", "Jump", "\x00", "İ", "ß", "☃", "<", ">",
     "R'", "u'", "'", "’", "2", "F''"]
)  # fmt: skip
REPLIES = st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=40).map("".join)
VALID = st.one_of(
    st.just(GRID),
    st.just(CUBE),
    st.just(()),
    st.lists(st.text(max_size=6), max_size=4).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(text=REPLIES, valid=VALID, k=st.integers(1, 7), think=st.booleans())
def test_never_raises_and_returns_only_valid_actions(text, valid, k, think):
    parsed = parse_reply(text, valid, k, think=think)
    assert len(parsed.actions) <= k
    if valid:
        assert all(action in valid for action in parsed.actions)
    else:
        assert parsed.actions in ((), (parsed.answer,))
        assert parsed.unknown_actions == 0
    assert parsed.format_ok == bool(parsed.actions)
    assert set(parsed.problems) <= set(PROBLEMS)
    assert len(set(parsed.problems)) == len(parsed.problems)
    assert not (parsed.actions and FATAL & set(parsed.problems))
    assert parsed.unknown_actions >= 0 and parsed.extra_actions >= 0
    assert parsed.think == parsed.think.strip() and parsed.answer == parsed.answer.strip()
    if not think:
        assert parsed.think == ""


SEPARATORS = st.sampled_from([" || ", "||", " | ", ", ", "\n", " ;"])


@settings(max_examples=200, deadline=None)
@given(
    chosen=st.lists(st.sampled_from(GRID), min_size=1, max_size=9),
    case_fn=st.sampled_from([str.upper, str.lower, str.title, str]),
    sep=SEPARATORS,
    k=st.integers(1, 7),
    think=st.booleans(),
)
def test_well_formed_replies_round_trip(chosen, case_fn, sep, k, think):
    answer = sep.join(case_fn(word) for word in chosen)
    text = ("<think>plan</think>" if think else "") + f"<answer>{answer}</answer>"
    parsed = parse_reply(text, GRID, k, think=think)
    assert parsed.actions == tuple(chosen[:k])
    assert parsed.extra_actions == max(0, len(chosen) - k)
    assert parsed.problems == (("extra_actions",) if len(chosen) > k else ())
    assert parsed.format_ok


@settings(max_examples=200, deadline=None)
@given(
    chosen=st.lists(st.sampled_from(CUBE), min_size=1, max_size=9),
    case_fn=st.sampled_from([str.upper, str.lower, str]),
    stop=st.sampled_from(["", ".", "!", " ."]),
    sep=SEPARATORS,
    k=st.integers(1, 7),
)
def test_cube_turns_keep_their_prime_in_any_case_after_any_separator(chosen, case_fn, stop, sep, k):
    answer = sep.join(case_fn(word) + stop for word in chosen)
    parsed = parse_reply(f"<think>plan</think><answer>{answer}</answer>", CUBE, k)
    assert parsed.actions == tuple(chosen[:k])
    assert parsed.unknown_actions == 0 and parsed.format_ok


@pytest.mark.parametrize(
    ("word", "problem"),
    [
        ("Dragon", None),
        ("Sea Serpent", None),
        ("x||y", "separator"),
        ("a;b", "separator"),
        ("two\nlines", "separator"),
        ("  ", "blank"),
        ("win</ANSWER>", "tag"),
    ],
)
def test_action_word_problem_says_why_a_word_cannot_be_parsed(word, problem):
    found = action_word_problem(word)
    assert found is None if problem is None else problem in found
    if found is None:  # what passes the check is what a reply can choose
        parsed = parse_reply(f"<think>t</think><answer>{word}</answer>", [word, "Other"], 1)
        assert parsed.actions == (word,)


@pytest.mark.parametrize("name", envs.names())
def test_every_registered_env_action_can_be_chosen(name):
    env = envs.make(name)
    for word in env.actions:
        assert action_word_problem(word) is None
        reply = f"<think>t</think><answer>{word}</answer>"
        assert parse_reply(reply, env.actions, 1).actions == (word,)
