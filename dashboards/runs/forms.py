"""A person's answer to a run that waits for one (the guard's handoff)."""

from __future__ import annotations

from django import forms

ANSWERS = {
    # answer: (button label, what it does)
    "resume": ("Resume", "the run goes on: checks decide again"),
    "stop": ("Stop", "the run is abandoned: every check answers terminate"),
}


class HandoffAnswerForm(forms.Form):
    answer = forms.ChoiceField(choices=[(k, label) for k, (label, _) in ANSWERS.items()])
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}), max_length=4000)
    # The handoff the person was shown (its "at"): an answer to an older one is refused.
    shown_at = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if not (data.get("note") or "").strip():
            why = {
                "resume": "say what changed so that the run may go on",
                "stop": "say why the run stops",
            }.get(data.get("answer") or "", "say why")
            self.add_error("note", f"note: required — {why}.")
        return data
