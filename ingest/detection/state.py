"""The engine's memory of one run: compact, bounded, and serialisable to JSON.

Every collection is capped, so the cost per event does not grow with the run's length; what
falls out of a cap is the oldest, which matters least to "is the agent repeating itself now".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

MAX_SIGS = 512  # signatures remembered (a run rarely has more distinct calls that matter)
MAX_FACTS = 3000  # facts remembered for novelty
MAX_PENDING = 256  # calls waiting for their result
MAX_GOALS = 512
RECENT_CALLS = 12  # for periodicity (oscillation) and near-duplicates (perturbation)
MAX_QUESTIONS = 10
USER_MEMORY = 6  # the user's recent turns, to tell news from the user repeating themselves
TEXT_MEMORY = 3  # the model's recent texts since its last tool call, to tell it restating itself
MAX_INFERRED = 256  # tools whose kind their results revealed
STATE_VERSION = 2


@dataclass
class Call:
    """A tool call the engine has seen; kept while it waits for its result and in the recent window."""

    index: int
    round: int
    tool: str
    kind: str
    sig: str
    goal: str
    args: dict[str, Any]
    cursor: str  # digest of the cursor fields, "" when none
    write_key: str
    step: int
    digest: str | None = None  # of the result, once it came
    new_info: bool | None = None
    cluster: int = 1  # near-identical calls in a row that brought nothing new (perturbation)
    adjacent: bool = False  # directly after the previous call with the same signature
    kind_from: str = "event"  # event | config | name | result | default (kinds.py)
    world: int = 0  # RunState.world when it was sent
    reaction: bool = True  # sent after the previous identical call's result had come
    fresh: bool = False  # the first call with its signature in the run


@dataclass
class SigRecord:
    """One signature's streak of unchanged results."""

    streak: int = 0  # occurrences whose results were identical, in a row for this signature
    last_digest: str | None = None
    first_call: int = 0  # call index where the streak began
    last_call: int = 0
    last_round: int = 0
    adjacent: bool = True  # every occurrence followed the previous one directly
    fired: int = 0  # highest action level fired for this streak
    fired_at: int = 0  # the streak count at the last firing
    cursors: list[str] = field(default_factory=list)  # cursor digests seen (advancing = new)
    polls_unchanged: int = 0
    poll_since_ts: float = 0.0
    world: int = 0  # the stretch of the run (RunState.world) its streak belongs to
    status: str = ""  # the status field of its last result (kinds.status_of)
    answered_call: int = 0  # the index of the last call of it whose result came


@dataclass
class RunState:
    version: int = STATE_VERSION
    events: int = 0
    calls: int = 0
    round: int = 0
    step: int = 0
    step_round: int = 0
    last_progress_step: int = 0
    steps_without_progress: int = 0
    no_progress_fired: int = 0
    np_step: int = 0  # the last step counted as without progress
    start_ts: float | None = None
    last_ts: float | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    budgets: dict[str, float] = field(default_factory=dict)
    budget_fired: list[str] = field(default_factory=list)
    terminated_by: str = ""
    budget_type: str = ""
    max_action: int = 0
    retry_tool: str = ""
    prev_sig: str = ""
    retries: int = 0
    sigs: dict[str, SigRecord] = field(default_factory=dict)
    pending: dict[str, list[Call]] = field(default_factory=dict)
    recent: list[Call] = field(default_factory=list)
    facts: dict[str, None] = field(default_factory=dict)
    errors: dict[str, list[Any]] = field(
        default_factory=dict
    )  # sig -> [class, digest, count, fired, world, stubborn]
    writes: dict[str, str] = field(default_factory=dict)  # write key -> last status
    write_attempts: dict[str, int] = field(default_factory=dict)
    perturbed: dict[str, int] = field(default_factory=dict)  # goal -> level fired
    goals: dict[str, int] = field(default_factory=dict)
    # What the user said: requests to the user, [text key, asks, answered since the last ask, fired].
    questions: list[list[Any]] = field(default_factory=list)
    user_keys: list[str] = field(default_factory=list)  # the user's last turns (text keys)
    user_ids: list[str] = field(default_factory=list)  # numbers, codes, e-mails the user gave
    user_messages: int = 0
    # The world changes when the user takes a turn or a write changes something: what the agent reads
    # (or retries) after it asks a new question. Counts repeat within one stretch of it.
    world: int = 0
    news_since_text: bool = False  # the user brought news since the model last spoke
    texts: list[str] = field(default_factory=list)  # the model's texts since its last tool call
    monologue: int = 0
    monologue_fired: int = 0
    monologue_replied: bool = False  # the user replied (with nothing new) during the restating
    replied: bool = False  # the user took a turn since the model last spoke
    announcements: int = 0  # announcement rounds since the last tool call or news
    announcement_fired: int = 0
    stalled: int = 0  # requests to the user answered only by the user repeating themselves
    stalled_fired: int = 0
    asked: bool = False  # the model's last text asked the user for something
    tried: bool = False  # a call never made before failed since the model last asked the user
    # Tool calls written in the text since the last real call: digest -> [times, fired].
    printed: dict[str, list[Any]] = field(default_factory=dict)
    harness: list[Any] = field(default_factory=lambda: ["", 0, 0])  # [message key, in a row, fired]
    inferred: dict[str, str] = field(default_factory=dict)  # tool -> kind its results revealed
    targets: dict[str, None] = field(default_factory=dict)  # ids, paths, urls already looked at
    last_result: str = ""  # digest of the previous call's result
    empty_rounds: int = 0
    empty_fired: int = 0
    round_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies recursively and was most of a save's time.
        data = {name: getattr(self, name) for name in _PLAIN_FIELDS}
        data["sigs"] = {k: vars(v).copy() for k, v in self.sigs.items()}
        data["pending"] = {k: [vars(c).copy() for c in v] for k, v in self.pending.items()}
        data["recent"] = [vars(c).copy() for c in self.recent]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        if data.get("version") == 1:
            data = _upgrade_v1(data)
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state version {data.get('version')!r}, expected {STATE_VERSION}")
        state = cls(**{k: v for k, v in data.items() if k not in ("sigs", "pending", "recent")})
        state.sigs = {k: SigRecord(**v) for k, v in data["sigs"].items()}
        state.pending = {k: [Call(**c) for c in v] for k, v in data["pending"].items()}
        state.recent = [Call(**c) for c in data["recent"]]
        return state


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 state (saved before the conversation was tracked) as version 2: the runs in
    flight when loopwatch is upgraded go on where they were, with the new memory empty."""
    known = {f.name for f in fields(RunState)}
    out = {k: v for k, v in data.items() if k in known}
    # [key, round, answered, asks, fired] -> [key, asks, answered, fired]
    out["questions"] = [[q[0], q[3], q[2], q[4]] for q in data.get("questions", []) if len(q) == 5]
    out["version"] = STATE_VERSION
    return out


def remember(mapping: dict[str, Any], key: str, value: Any, cap: int) -> None:
    """Insert or refresh `key` as the newest entry; drop the oldest past `cap`."""
    mapping.pop(key, None)
    mapping[key] = value
    while len(mapping) > cap:
        mapping.pop(next(iter(mapping)))


_PLAIN_FIELDS = tuple(f.name for f in fields(RunState) if f.name not in ("sigs", "pending", "recent"))
