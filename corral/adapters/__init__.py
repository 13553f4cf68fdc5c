"""Corral as the environment backend of agent and RL frameworks.

One module per framework, each an optional extra that `import corral` never needs:

- `corral.adapters.swerex`: `CorralDeployment` / `CorralRuntime` (SWE-ReX), `corral[swerex]`
- `corral.adapters.minisweagent`: `CorralEnvironment` (mini-swe-agent), `corral[minisweagent]`
- `corral.adapters.skyrl`: `CorralTextEnv` (skyrl-gym's `BaseTextEnv`), `corral[skyrl]`
- `corral.adapters.verifiers`: `CorralSandboxEnv` (a verifiers `StatefulToolEnv`),
  `corral[verifiers]`

docs/trainers.md shows each.
"""

from corral.adapters._sync import SyncCorral

__all__ = ["SyncCorral"]
