"""The contract between Corral's layers: one home for every shared name and rule.

Every layer imports these modules directly (no re-exports), and they import
nothing of Corral's but each other, so they sit below the sandbox layer:

- `models`: the episode spec trainers write, every activity's input and
  result, node heartbeats and the registry's facts;
- `checks`: the validation rules the spec and the sandbox layer share;
- `config`: the stack configuration (temporal-dev.yaml + environment);
- `errors`: the one root exception, the sandbox layer's errors, and the error
  kinds that cross Temporal with their nature (retryable, a lost step, a
  refusal) carried as data;
- `labels`: every label Corral puts on containerd objects;
- `ids`: the names derived from an episode (its sandbox id, its calls
  workflow's id), image and snapshot names;
- `script`: how a scripted episode's steps run (the one rule every path follows);
- `search_attributes`: the episode's search attributes;
- `priority`: Falco's priorities.
"""
