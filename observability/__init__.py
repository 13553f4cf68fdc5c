"""Corral's observability layer: the bottom of the stack, importing no other Corral package.

- `observability.tracing`: OpenTelemetry tracing set-up, `span()`, Temporal's
  tracing interceptor, reading spans back (`read_spans`, `trace_tree`).
- `observability.metrics`: OpenTelemetry metrics on a Prometheus endpoint,
  Temporal SDK metrics, `scrape()` for `corral status`.
- `observability.records`: episode/step/alert records in Parquet part files.
- `observability.report`: `build_report()` for `corral report`.

Nothing is re-exported here so that `from observability.tracing import span`
(sandbox, activities) does not load polars or matplotlib.
"""
