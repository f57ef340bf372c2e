"""The operator: kopf handlers (`handlers`) that observe, plan with `icefall.plan` and act (`kube`)."""
