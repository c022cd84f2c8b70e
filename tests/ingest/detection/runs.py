"""A small builder of one run's events for detection tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ingest.detection import Config, Detection, Thresholds, replay_run


class RunBuilder:
    def __init__(self, run_id: str = "r1", **started: Any) -> None:
        self.run_id = run_id
        self.t0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
        self.seconds = 0.0
        self.round = 0
        self.calls = 0
        self.events: list[dict[str, Any]] = [self._event("run_started", **started)]

    def _event(self, event_type: str, /, **fields: Any) -> dict[str, Any]:
        ts = (self.t0 + timedelta(seconds=self.seconds)).isoformat().replace("+00:00", "Z")
        return {"type": event_type, "run_id": self.run_id, "ts": ts, **fields}

    def wait(self, seconds: float) -> RunBuilder:
        self.seconds += seconds
        return self

    def say(self, text: str = "", *, output_tokens: int = 40) -> RunBuilder:
        self.round += 1
        self.seconds += 1
        self.events.append(
            self._event(
                "model_round", round=self.round, input_tokens=500, output_tokens=output_tokens, text=text
            )
        )
        return self

    def user(self, text: str) -> RunBuilder:
        self.seconds += 5
        self.events.append(self._event("user_message", text=text))
        return self

    def call(
        self,
        tool: str,
        args: dict[str, Any],
        result: Any = None,
        *,
        kind: str = "read",
        status: str = "ok",
        error_class: str | None = None,
        new_round: bool = True,
        **extra: Any,
    ) -> RunBuilder:
        if new_round:
            self.say()
        self.calls += 1
        call_id = f"c{self.calls}"
        self.events.append(
            self._event(
                "tool_call", round=self.round, call_id=call_id, tool=tool, kind=kind, args=args, **extra
            )
        )
        self.seconds += 1
        fields: dict[str, Any] = {"call_id": call_id, "status": status, "result": result}
        if error_class:
            fields["error_class"] = error_class
        self.events.append(self._event("tool_result", **fields))
        return self

    def finish(self, status: str = "succeeded") -> RunBuilder:
        self.events.append(self._event("run_finished", status=status))
        return self

    def detect(self, **overrides: Any) -> list[Detection]:
        return replay_run(self.events, Config(thresholds=Thresholds().merged(overrides)))[1]


def interventions(found: list[Detection]) -> list[Detection]:
    return [d for d in found if d.action != "observe"]
