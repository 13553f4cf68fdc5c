"""Alerts the tests send to episodes, as the intake would."""

from __future__ import annotations

from policies.alert import make_alert
from policies.responses import Decision, DecisionAction
from workflows.models import AnomalySignal


def anomaly_signal(rule: str, action: DecisionAction) -> AnomalySignal:
    """The `anomaly` signal for an alert of `rule` that the responses map to `action`."""
    alert = make_alert(
        rule=rule,
        priority="Warning",
        output=f"{rule} fired",
        output_fields={"container.id": "0123456789ab"},
    )
    return AnomalySignal(alert=alert, decision=Decision(action=action, rule=rule))
