"""The model's words: the same question again, the same announcement without action, silence."""

from __future__ import annotations

import re
from typing import Any

from rapidfuzz import fuzz

from ingest.detection.config import Thresholds
from ingest.detection.normalize import fuzzy_view, text_key
from ingest.detection.policy import CORRECT, Detection, action_name, level_for
from ingest.detection.state import MAX_QUESTIONS, RunState

EMPTY_TOKENS = 3  # a round that said nothing and called nothing costs a few tokens at most


# Words that carry no content in a question or an announcement: a paraphrase changes these.
STOPWORDS = frozenset(
    """a an the is are was were be been am do does did can could would will shall should may might
    must i me my we our you your yours he she it its they them their this that these those what which
    who whom whose when where why how please kindly tell let know give provide share confirm just
    again so and or but if then to of in on for with at by from about as into up out now still also
    any some there here have has had need want like would could okay ok sure thanks thank yes no""".split()
)


def content_words(text: str) -> frozenset[str]:
    return frozenset(
        w.rstrip("s") for w in text.replace("?", " ").split() if w not in STOPWORDS and len(w) > 1
    )


def alike(a: str, b: str, threshold: float) -> bool:
    """Same words, or the same content words (a paraphrase keeps its nouns and verbs)."""
    if not a or not b:
        return False
    a, b = fuzzy_view(a), fuzzy_view(b)  # long texts: bounded work (issue 11)
    if max(fuzz.token_set_ratio(a, b), fuzz.token_sort_ratio(a, b)) / 100 >= threshold:
        return True
    wa, wb = content_words(a), content_words(b)
    if len(wa) < 2 or len(wb) < 2:
        return False
    return len(wa & wb) / len(wa | wb) >= threshold - 0.1


ANNOUNCEMENT = re.compile(
    r"\b(let me|let's|i'll|i will|i am going to|i'm going to|i'm about to|now i|next,? i|i shall|one moment)\b"
)
GENERIC = frozenset({"one", "use", "sure", "before", "continue", "proceed", "need", "able", "going", "again"})


def note_user_message(state: RunState) -> None:
    # A user message answers questions; a nudge ("please continue") is no action, so announcements go on.
    for question in state.questions:
        question[2] = True


def note_tool_call(state: RunState) -> None:
    state.question_streak, state.question_fired = [], 0
    state.announcements, state.announcement_fired = 0, 0


def detect_text(
    t: Thresholds, state: RunState, event: dict[str, Any], previous_round_calls: int
) -> list[Detection]:
    raw = event.get("text") or ""
    # Bounded as fuzzy matching sees it: the key is kept in the state (questions, last text).
    key = fuzzy_view(text_key(raw)) if isinstance(raw, str) else ""
    found: list[Detection] = []
    tokens = event.get("output_tokens")
    if not key and isinstance(tokens, int) and tokens <= EMPTY_TOKENS:
        state.empty_rounds += 1
        level = level_for(state.empty_rounds, t.empty_rounds, t.escalate_every)
        if level >= CORRECT and level > state.empty_fired:
            state.empty_fired = level
            found.append(
                _detection(
                    state,
                    "empty_responses",
                    level,
                    state.empty_rounds,
                    f"The last {state.empty_rounds} responses were empty. Answer the user or call a tool.",
                    {"rounds": state.empty_rounds},
                )
            )
        return found
    state.empty_rounds, state.empty_fired = 0, 0
    if not key:
        return found
    if "?" in raw:
        found += _question(t, state, key)
        found += _question_streak(t, state, key)
    else:
        found += _announcement(t, state, key, raw)
    if "?" in raw:
        pass
    elif alike(key, state.last_text, t.text_similarity) and state.calls == state.last_text_calls:
        state.monologue += 1
        level = level_for(state.monologue, t.monologue_repeats, t.escalate_every)
        if level >= CORRECT and level > state.monologue_fired:
            state.monologue_fired = level
            found.append(
                _detection(
                    state,
                    "monologue",
                    level,
                    state.monologue,
                    f"You said {raw.strip()[:80]!r} {state.monologue} times without doing it. Call the tool now "
                    "or explain what stops you.",
                    {"text": raw.strip()[:200]},
                )
            )
    else:
        state.monologue, state.monologue_fired = 1, 0
    state.last_text, state.last_text_calls = key, state.calls
    return found


def _question_streak(t: Thresholds, state: RunState, key: str) -> list[Detection]:
    """Questions in a row, without a tool call between, about the same thing (in other words too)."""
    words = content_words(key) - GENERIC
    related = any(words & (content_words(q) - GENERIC) for q in state.question_streak)
    state.question_streak = [*state.question_streak, key] if related or not state.question_streak else [key]
    del state.question_streak[: -t.question_rounds * 3]
    count = len(state.question_streak)
    level = level_for(count, t.question_rounds, t.escalate_every)
    if level < CORRECT or level <= state.question_fired or not state.questions or not state.questions[0][2]:
        return []
    state.question_fired = level
    return [
        _detection(
            state,
            "clarification",
            level,
            count,
            f"You have asked the user {count} questions in a row about the same thing without acting on the "
            "answers. Use what they told you, or hand over to a person.",
            {"questions": state.question_streak[-3:]},
        )
    ]


def _announcement(t: Thresholds, state: RunState, key: str, raw: str) -> list[Detection]:
    """Saying what it will do, round after round, in other words each time, and not doing it."""
    if not ANNOUNCEMENT.search(raw.casefold().replace("\u2019", "'")):
        return []
    state.announcements += 1
    level = level_for(state.announcements, t.announcement_rounds, t.escalate_every)
    if level < CORRECT or level <= max(state.announcement_fired, state.monologue_fired):
        return []
    state.announcement_fired = level
    return [
        _detection(
            state,
            "monologue",
            level,
            state.announcements,
            f"You have announced an action {state.announcements} times (now {raw.strip()[:80]!r}) without "
            "calling a tool. Call it now or explain what stops you.",
            {"text": raw.strip()[:200], "rounds": state.announcements},
        )
    ]


def _question(t: Thresholds, state: RunState, key: str) -> list[Detection]:
    for question in state.questions:
        if alike(key, question[0], t.text_similarity):
            question[3] += 1
            answered = question[2]
            # Asked again after the user answered: the model ignored the answer. Asked again with no
            # answer yet: the user may simply be slow, so one more ask is allowed.
            level = level_for(question[3], 2 if answered else 3, t.escalate_every)
            if level < CORRECT or level <= question[4]:
                return []
            question[4] = level
            return [
                _detection(
                    state,
                    "clarification",
                    level,
                    question[3],
                    (
                        "You have asked the user this question before"
                        + (" and they answered it" if answered else "")
                        + f" ({question[3]} times now). Use the answer you have, or hand over to a person."
                    ),
                    {"question": key[:200], "answered": answered, "asks": question[3]},
                )
            ]
    state.questions.append([key, state.round, False, 1, 0])
    del state.questions[:-MAX_QUESTIONS]
    return []


def _detection(state: RunState, kind: str, level: int, count: int, hint: str, evidence: dict) -> Detection:
    return Detection(
        kind=kind,
        action=action_name(level),
        at_call=state.calls,
        at_round=state.round,
        count=count,
        hint=hint,
        evidence=evidence,
    )
