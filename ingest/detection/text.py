"""The conversation: what the user says, what the model says, and what a harness says for it.

A user's turn is input. It is news when it is not the user repeating themselves (alike one of
their last turns); news resets the model's repetitions (answering a new turn in words used before
is not restating oneself) and changes the world (engine.py). A message whose `sender` is not the
user — a harness's "No tool calls found…", a task statement — is not the user bringing news: the
same harness message again and again means the model's replies keep being rejected.

The model's words are looked at for three loops:

- clarification: a request to the user (a question, "could you provide: …") alike one the user
  already answered. "I don't have it" is no answer, so asking again after it is fine; a decision
  put to the user ("would you like to proceed?") is not a request for information, so offering it
  again after a refusal is the agent holding its ground, not a loop. Requests answered only by the
  user repeating themselves ("could you rephrase?" while the user says the same) pile up too.
- monologue: the same text again with no tool call and no news from the user between; or
  announcements of an action ("let me…", "I will…") round after round without the action.
- empty responses: rounds that said nothing and called nothing.
"""

from __future__ import annotations

import re
from typing import Any

from rapidfuzz import fuzz

from ingest.detection.config import Thresholds
from ingest.detection.normalize import digest, text_key
from ingest.detection.policy import CORRECT, Detection, action_name, level_for
from ingest.detection.state import MAX_QUESTIONS, TEXT_MEMORY, USER_MEMORY, RunState, remember

EMPTY_TOKENS = 3  # a round that said nothing and called nothing costs a few tokens at most
# Of a long text, the beginning and the end are read for requests and announcements (a request
# closes a long summary; a task statement of pages asks nothing of the model's loops): the cost of
# an event stays bounded whatever the length of what was said.
SCAN_HEAD, SCAN_TAIL = 1000, 2000
# Texts longer than this are compared by their first TEXT_PREFIX characters (and whole by hash):
# fuzzy matching costs grow with the square of the length.
TEXT_PREFIX = 600
# Tokens that identify something (a number, an e-mail, a code such as ZX81QT or anya_garcia_5901).
USER_ID = re.compile(r"[\w.+-]*[\d@_][\w.@+-]*")
USER_IDS = 50  # identifiers the user gave, remembered
PRINTED_MEMORY = 8  # tool calls written in the text since the last real call, remembered
USER_SENDERS = frozenset({"", "user", "human", "customer"})

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
    """Same words, or the same content words (a paraphrase keeps its nouns and verbs).

    Two texts of very different lengths are not alike: one's words all being in the other (a "6"
    inside a paragraph) says nothing about the other's meaning.
    """
    if not a or not b:
        return False
    if a == b:
        return True
    if len(a) > TEXT_PREFIX or len(b) > TEXT_PREFIX:
        if digest(a) == digest(b):
            return True
        a, b = a[:TEXT_PREFIX], b[:TEXT_PREFIX]
    short, long = sorted((len(a), len(b)))
    if short < 0.5 * long:
        return False
    if max(fuzz.token_set_ratio(a, b), fuzz.token_sort_ratio(a, b)) / 100 >= threshold:
        return True
    wa, wb = content_words(a), content_words(b)
    if len(wa) < 2 or len(wb) < 2:
        return False
    return len(wa & wb) / len(wa | wb) >= threshold - 0.1


GENERIC = frozenset(
    {
        "one",
        "use",
        "sure",
        "before",
        "continue",
        "proceed",
        "need",
        "able",
        "going",
        "again",
        "go",
        "ahead",
        "great",
        "good",
        "fine",
        "perfect",
        "right",
        "correct",
        "hello",
        "hi",
        "hey",
        "wait",
        "hold",
        "task",
    }
)
ANNOUNCEMENT = re.compile(
    r"\b(let me|let's|i'll|i will|i am going to|i'm going to|i'm about to|now i|next,? i|i shall|one moment)\b"
)
# A user who does not have the answer (yet): asking again later is not ignoring an answer.
NON_ANSWER = re.compile(
    r"\b(do not|don't|dont|did not|didn't|can't|cannot|can not|couldn't|could not) "
    r"(have|know|remember|recall|find|see|access|locate)\b"
    r"|\bnot sure\b|\bno idea\b|\bforgot\b|\bnot (handy|at hand|with me|available)\b"
    r"|\boff the top of my head\b|\blet me (check|look|find|see)\b|\bi'll (check|look|find)\b"
)
# A decision put to the user (to confirm, to choose to proceed): not a request for information.
# Most are recognised by how the sentence opens ("would you like…", not "which order would you like…").
_LEAD = (
    r"^(?:(?:so|ok|okay|great|alright|all right|now|also|and|then|perfect|sure|lastly|finally|first)[,\s]+)*"
)
DECISION = re.compile(
    _LEAD + r"(would you like|do you want|do you wish|shall i|should i|shall we|would you prefer|"
    r"do you prefer|can i|may i (proceed|go ahead)|is (that|this|everything) (correct|right|ok|okay|fine|alright)|"
    r"(does|would) (that|this) (work|sound|be)|are you sure|do you (agree|approve|accept|confirm))\b"
    r"|\b(anything else|is there (anything|something)|confirm (that|if|whether|by|your (choice|selection))|"
    r"let me know if|if you have any|if so|if you (prefer|want|would like|wish|need)|if there (is|are)|"
    r"move forward|which option|(ready|okay|ok|happy|good) to (proceed|go ahead)|"
    r"(is|are) (this|that|these|the above|everything) (information |details )?(correct|right|accurate))\b"
    r"|\b(like|want|wish|how|whether|ready) to (proceed|go ahead|continue|move forward)\b"
    r"|\bwith a (yes|no)\b|\b(yes|no) ?(/|or) ?(yes|no)\b|\bconfirm (with )?(a )?yes\b"
    r"|\b(proceed|go ahead)\?$"
)
# A request for information that need not end with a question mark ("Could you provide: 1. …").
REQUEST = re.compile(
    r"\b((could|can|would|will) you (please )?(provide|give|tell|share|send|confirm|specify|clarify|"
    r"rephrase|repeat|explain|let me know|check)|please (provide|share|tell|send|specify|clarify|"
    r"confirm|rephrase|repeat|let me know)|may i (have|get|know|ask)|i (will )?need (your|the|you to))\b"
)
# A tool call written out in the text instead of made (a model whose tool-call format broke):
# {"name": "cancel_reservation", "arguments": {…}}.
PRINTED_CALL = re.compile(
    r'\{\s*"(?:name|tool|function)"\s*:\s*"[^"]{1,100}"\s*,\s*"(?:arguments|parameters|args|input)"\s*:.{0,800}?\}\s*\}',
    re.S,
)
_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n")


def scanned(raw: str) -> str:
    """The part of a text read for patterns, case-folded: its head and tail when it is long."""
    if len(raw) > SCAN_HEAD + SCAN_TAIL:
        raw = raw[:SCAN_HEAD] + "\n\n" + raw[-SCAN_TAIL:]
    return raw.casefold().replace("\u2019", "'")


def key_of(raw: str) -> str:
    """text_key of a text, bounded (the comparisons read TEXT_PREFIX characters of it)."""
    return text_key(raw[: 2 * TEXT_PREFIX])[:TEXT_PREFIX]


def requests_in(raw: str) -> str:
    """The model's requests for information in a text, as one key ("" when it asks for none).

    Per paragraph: its sentences that ask (a question, or a request such as "could you provide")
    and are not a decision put to the user; a request ending with a colon brings the lines after
    it (the list of what is asked for).
    """
    lowered = scanned(raw)
    if "?" not in lowered and not REQUEST.search(lowered):
        return ""
    parts: list[str] = []
    for paragraph in _PARAGRAPH.split(lowered):
        sentences = [s.strip() for s in _SENTENCE.split(paragraph) if s.strip()]
        for i, sentence in enumerate(sentences):
            if DECISION.search(sentence):
                continue
            if sentence.endswith("?") or REQUEST.search(sentence):
                parts.append(sentence)
                if sentence.endswith(":"):
                    parts += sentences[i + 1 :]
                    break
    return text_key(" ".join(parts))[:TEXT_PREFIX]


def user_message(t: Thresholds, state: RunState, event: dict[str, Any]) -> tuple[bool, bool, list[Detection]]:
    """A user_message: (from the user, bringing news, detections). A harness's message is neither."""
    raw: str = event["text"] if isinstance(event.get("text"), str) else ""
    sender = event.get("sender")
    if isinstance(sender, str) and sender.strip().casefold() not in USER_SENDERS:
        return False, False, _harness(t, state, key_of(raw), sender)
    state.user_messages += 1
    state.harness = ["", 0, 0]
    state.replied = True
    key = key_of(raw)
    non_answer = bool(NON_ANSWER.search(scanned(raw)))
    # News: an id, number, e-mail or code not given before; "I don't have it" (also worth knowing);
    # else words unlike the user's last turns — but not a nudge ("please continue", "yes, thanks").
    ids = {m.strip(".+-").casefold() for m in USER_ID.findall(raw[:TEXT_PREFIX])} - {""}
    new_id = bool(ids - set(state.user_ids))
    nudge = len({w for w in content_words(key) - GENERIC if len(w) > 2}) <= 1
    repeated = not nudge and any(alike(key, before, t.text_similarity) for before in state.user_keys)
    news = new_id or non_answer or not (nudge or repeated)
    state.user_keys = [*state.user_keys[-(USER_MEMORY - 1) :], key]
    state.user_ids = [*(i for i in state.user_ids if i not in ids), *sorted(ids)][-USER_IDS:]
    for question in state.questions:
        # Any reply but "I don't have it" answers what was asked, the user repeating themselves too.
        question[2] = question[2] or not non_answer
    if non_answer:
        state.stalled, state.stalled_fired = 0, 0
    elif news or not repeated:
        # A request answered with something new, or a plain "yes", starts a new stretch of requests
        # (it is its first): only the user saying again what they said before stalls it.
        state.stalled, state.stalled_fired = (1 if state.asked else 0), 0
    if news:
        state.news_since_text = True
        state.announcements, state.announcement_fired = 0, 0
    state.asked = False
    return True, news, []


def note_tool_call(state: RunState) -> None:
    state.printed = {}
    state.texts, state.monologue, state.monologue_fired, state.monologue_replied = [], 0, 0, False
    state.announcements, state.announcement_fired = 0, 0
    state.harness = ["", 0, 0]


def detect_text(
    t: Thresholds, state: RunState, event: dict[str, Any], previous_round_calls: int
) -> list[Detection]:
    raw = event.get("text") or ""
    key = key_of(raw) if isinstance(raw, str) else ""
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
    found += _printed(t, state, raw)
    request = requests_in(raw)
    state.asked = bool(request)
    if request:
        found += _request(t, state, request)
        found += _stalled(t, state)
        state.tried = False
    else:
        found += _announcement(t, state, raw)
    found += _restated(t, state, key, raw)
    return found


def _restated(t: Thresholds, state: RunState, key: str, raw: str) -> list[Detection]:
    """The same text as one said since the last tool call, with nothing new from the user between."""
    again = not state.news_since_text and any(alike(key, said, t.text_similarity) for said in state.texts)
    state.texts = [*state.texts[-(TEXT_MEMORY - 1) :], key]
    state.news_since_text = False
    replied, state.replied = state.replied, False
    if not again:
        state.monologue, state.monologue_fired, state.monologue_replied = 1, 0, False
        return []
    state.monologue += 1
    # Talking to itself, the 2nd time is one too many; with the user replying between (if only to
    # say the same again), one more: the user may yet bring something.
    state.monologue_replied = state.monologue_replied or replied
    first = t.monologue_repeats + (1 if state.monologue_replied else 0)
    level = level_for(state.monologue, first, t.escalate_every)
    if level < CORRECT or level <= max(state.monologue_fired, state.announcement_fired):
        return []
    state.monologue_fired = level
    return [
        _detection(
            state,
            "monologue",
            level,
            state.monologue,
            f"You said {raw.strip()[:80]!r} {state.monologue} times and nothing new came between. Act on "
            "it (call the tool), answer differently, or explain what stops you.",
            {"text": raw.strip()[:200]},
        )
    ]


def _announcement(t: Thresholds, state: RunState, raw: str) -> list[Detection]:
    """Saying what it will do, round after round, in other words each time, and not doing it."""
    if not ANNOUNCEMENT.search(scanned(raw)):
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


def _printed(t: Thresholds, state: RunState, raw: str) -> list[Detection]:
    """The same tool call written in the text, round after round, and never made: whatever the user
    says between, it is announced and not done."""
    if '"name"' not in raw and '"tool"' not in raw and '"function"' not in raw:
        return []
    match = PRINTED_CALL.search(raw[: SCAN_HEAD + SCAN_TAIL])
    if match is None:
        return []
    key = digest(text_key(match.group()))
    seen = state.printed.get(key) or [0, 0]
    seen[0] += 1
    remember(state.printed, key, seen, PRINTED_MEMORY)
    count = seen[0]
    level = level_for(count, t.announcement_rounds, t.escalate_every)
    if level < CORRECT or level <= seen[1]:
        return []
    seen[1] = level
    return [
        _detection(
            state,
            "monologue",
            level,
            count,
            f"You have written the same tool call in your reply {count} times ({match.group()[:80]!r}) "
            "instead of calling the tool. Call it through the tool interface, or explain what stops you.",
            {"text": match.group()[:200], "rounds": count},
        )
    ]


def _request(t: Thresholds, state: RunState, key: str) -> list[Detection]:
    """A request alike an earlier one: counted when the user answered the earlier one."""
    for question in state.questions:
        if not alike(key, question[0], t.text_similarity):
            continue
        verbatim = key == question[0]
        question[0] = key  # follow the wording as it drifts
        if not question[2]:
            return []  # not answered (or "I don't have it"): asking again is fine
        if state.tried:
            question[2] = False
            return []  # the answer was tried (a new call) and failed: asking again is the next step
        question[1] += 1
        question[2] = False
        # The request again after the user answered it: the answer was ignored. Word for word, the
        # 2nd time says so; in other words, the 3rd (a rephrasing may ask for more than before).
        level = level_for(question[1], 2 if verbatim else 3, t.escalate_every)
        if level < CORRECT or level <= question[3]:
            return []
        question[3] = level
        return [
            _detection(
                state,
                "clarification",
                level,
                question[1],
                "You have asked the user this before and they answered it "
                f"({question[1]} times asked now). Use the answer you have, or hand over to a person.",
                {"question": key[:200], "answered": True, "asks": question[1]},
            )
        ]
    state.questions.append([key, 1, False, 0])
    del state.questions[:-MAX_QUESTIONS]
    return []


def _stalled(t: Thresholds, state: RunState) -> list[Detection]:
    """Requests in a row that the user answers only by saying what they said before (the first
    may have been answered with something new): the agent does not take the answer."""
    # After an answer was tried and failed, asking again starts over.
    state.stalled = 1 if state.tried else state.stalled + 1
    count = state.stalled
    level = level_for(count, t.question_rounds, t.escalate_every)
    if level < CORRECT or level <= state.stalled_fired:
        return []
    state.stalled_fired = level
    return [
        _detection(
            state,
            "clarification",
            level,
            count,
            f"You have asked the user {count} times in a row and they keep telling you the same thing. "
            "Act on what they said, or hand over to a person.",
            {"requests": count, "user": state.user_keys[-1][:200] if state.user_keys else ""},
        )
    ]


def _harness(t: Thresholds, state: RunState, key: str, sender: str) -> list[Detection]:
    """The same message from the harness in a row (the model's replies between do not reset it)."""
    same = state.harness[1] and alike(key, state.harness[0], t.text_similarity)
    state.harness = [key, state.harness[1] + 1, state.harness[2]] if same else [key, 1, 0]
    count = state.harness[1]
    level = level_for(count, t.harness_repeats, t.escalate_every)
    if level < CORRECT or level <= state.harness[2]:
        return []
    state.harness[2] = level
    return [
        _detection(
            state,
            "repeated_error",
            level,
            count,
            f"Your last {count} replies were rejected with the same message ({key[:80]!r}). Do what it "
            "asks, in the form it asks for, or stop.",
            {"error_class": "harness", "sender": sender[:100], "message": key[:200], "failures": count},
        )
    ]


def _detection(
    state: RunState, kind: str, level: int, count: int, hint: str, evidence: dict[str, Any]
) -> Detection:
    return Detection(
        kind=kind,
        action=action_name(level),
        at_call=state.calls,
        at_round=state.round,
        count=count,
        hint=hint,
        evidence=evidence,
    )
