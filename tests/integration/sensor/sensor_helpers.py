"""Shared by the live sensor tests: a fake sandbox cgroup the test makes itself."""

from __future__ import annotations

import subprocess
import time
import uuid

from policies.sensor.cgroups import parent_dir


class FakeSandbox:
    """A v1 cgroup /corral/<id> in the sensor's controller; processes join by pid."""

    def __init__(self) -> None:
        self.full_id = uuid.uuid4().hex + uuid.uuid4().hex
        self.path = parent_dir() / self.full_id
        self.path.mkdir(parents=True)

    def run(self, cmd: str) -> subprocess.CompletedProcess[str]:
        # The shell moves itself into the cgroup before running the command.
        script = f"echo $$ > {self.path}/cgroup.procs && {cmd}"
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
