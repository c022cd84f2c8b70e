"""The operator's decision on one open operation."""

from __future__ import annotations

from django import forms

from ingest.models import Operation

ACTIONS = {
    # action: (label, the status it leads to; "" for a reconciliation request)
    "succeeded": ("mark succeeded", Operation.Status.SUCCEEDED),
    "not_executed": ("mark not executed", Operation.Status.RETRYABLE_FAILED),
    "compensate": ("compensate", Operation.Status.COMPENSATED),
    "reconcile": ("retry reconciliation now", ""),
}


class DecisionForm(forms.Form):
    action = forms.ChoiceField(choices=[(k, label) for k, (label, _) in ACTIONS.items()])
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=4000)
    external_reference = forms.CharField(required=False, max_length=500)
    # The status the operator was shown: a form older than the operation's state is refused.
    shown_status = forms.ChoiceField(choices=Operation.Status.choices, widget=forms.HiddenInput)

    def __init__(self, *args, reconciler: bool = True, tool: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reconciler = reconciler
        self.tool = tool

    def clean(self):
        super().clean()
        data = self.cleaned_data
        action = data.get("action")
        if action == "reconcile" and not self.reconciler:
            self.add_error(
                "action",
                f"action: no reconciler is configured for {self.tool}, so there is nothing to ask: "
                "a person decides.",
            )
        if not (data.get("note") or "").strip():
            why = {
                "compensate": "say what was done to undo the effect",
                "succeeded": "say how you know it happened",
                "not_executed": "say how you know it did not happen",
            }.get(action or "", "say why")
            self.add_error("note", f"note: required — {why}.")
        if action == "succeeded" and not (data.get("external_reference") or "").strip():
            self.add_error(
                "external_reference",
                "external reference: required to mark it succeeded (the downstream's id of the effect).",
            )
        return data


def named_errors(form: forms.Form) -> list[str]:
    """Every error as `field: message` (Django's own messages do not name their field)."""
    out = []
    for name, errors in form.errors.items():
        for error in map(str, errors):
            named = name == "__all__" or error.startswith((f"{name}:", name.replace("_", " ")))
            out.append(error if named else f"{name}: {error}")
    return out
