"""The operator SDK: what `corral` does for an operator, callable from Python.

`corral.sdk` is the trainers' side of the face (episodes); `corral.ops` is the
operators' side, by subject: `stack` (up, down, status), `nodes` (join, stop,
kill, list, drain, forget), `images` (build, import, pull, push, list, prune,
remove), `sandboxes` (a one-off sandbox), `policies` (validate, explain, test rules),
`observe` (report, Prometheus scrape config, records, traces) and `tenants`.
The CLI reaches the layers below only through these and the SDK; each CLI
command parses its arguments, calls one of these functions and prints.

The modules import nothing heavy at import time beyond what their subject
needs (Temporal, containerd and polars are imported where used), so that the
CLI's help stays fast and works without the optional extras.
"""
