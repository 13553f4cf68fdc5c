"""`corral bench`: the benchmarks, one module per mode.

`core.py` is the plain `corral bench` (Corral against the raw containerd
baseline, and `--density`) with the measuring helpers the other modes share;
each other mode has its module (`burst.py`, `defense.py`, `drill.py` with its
cases in `drill_cases.py`, `elastic.py`, `fork.py`, `peers.py`, `sensor.py`,
`steps.py`, `watermark.py`), and the peers they compare against (a private
dockerd, podman) are brought by `engines.py`. The CLI imports each module
lazily, from its own path; nothing is re-exported here.
"""
