"""A node admits by what its sandboxes use, with hysteresis (activities/capacity.py)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from activities.capacity import (
    AdmissionGate,
    NodeBudgetConfig,
    SandboxCpuMeter,
    cpu_pressure,
    free_slots,
    headroom,
    measure,
    node_capacity,
    room_for,
)
from activities.pool import asking_paused, largest_burst
from contract.models import NodeCapacity, NodeUsage

CAPACITY = NodeCapacity(cores=2, memory_mb=1000, pids=10_000, max_sandboxes=5000)


def _use(**kw: float) -> NodeUsage:
    return NodeUsage.model_validate({"memory_mb": 100, "pids": 500, **kw})


def test_a_thousand_idle_sandboxes_with_nominal_cores_fit_a_two_core_node() -> None:
    gate = AdmissionGate(CAPACITY)
    # 1,000 idle sandboxes of 1 core each: 1,000 nominal cores on 2 physical.
    use = gate.judge(_use(sandboxes=1000, cpu_cores=1000.0, cpu_pressure=99.0))
    assert use.admitting and room_for(CAPACITY, use) is None


def test_cpu_pressure_closes_the_gate_only_while_sandboxes_use_the_cores() -> None:
    gate = AdmissionGate(CAPACITY)
    assert not gate.judge(_use(cpu_pressure=95.0, sandbox_cpu=1.8)).admitting
    # Still above the low-water mark and the sandboxes still busy: stays closed.
    closed = gate.judge(_use(cpu_pressure=70.0, sandbox_cpu=1.2))
    assert not closed.admitting
    assert "CPU pressure 70% >= 90% while sandboxes use 1.2 of 2 cores" in closed.closed
    # A provision is never refused for pressure: placement alone steers by it.
    assert gate.hard_limits() == "" and room_for(CAPACITY, closed, gate.hard_limits()) is None
    assert gate.judge(_use(cpu_pressure=70.0, sandbox_cpu=0.9)).admitting  # sandboxes eased
    # Pressure from anything but the sandboxes (provisioning, the control plane)
    # never closes it.
    assert gate.judge(_use(cpu_pressure=100.0, sandbox_cpu=0.2)).admitting


def test_sandbox_cpu_is_the_rate_of_their_cgroup_cpu_time(tmp_path: Path) -> None:
    usage = tmp_path / "cpuacct.usage"
    usage.write_text("1000000000\n")
    meter = SandboxCpuMeter(usage, min_interval_s=0.0)
    assert meter.cores() == 0.0  # the first reading only sets the start
    usage.write_text(str(1_000_000_000 + 10**12) + "\n")  # 1,000 s of CPU since
    assert meter.cores() > 0
    assert SandboxCpuMeter(tmp_path / "missing").cores() == 0.0


def test_memory_reopens_only_below_its_low_water_mark() -> None:
    gate = AdmissionGate(CAPACITY)  # 5 % hysteresis: reopens at 950 MiB
    assert not gate.judge(_use(memory_mb=1000)).admitting
    assert not gate.judge(_use(memory_mb=960)).admitting
    reopened = gate.judge(_use(memory_mb=950))
    assert reopened.admitting and reopened.closed == ""


def test_low_disk_closes_the_gate_and_says_so() -> None:
    gate = AdmissionGate(CAPACITY)
    use = gate.judge(_use(disk_free_mb=100))
    assert not use.admitting and "disk has 100 MiB free, under the 256 MiB floor" in use.closed
    assert gate.hard_limits() == use.closed
    assert not gate.judge(_use(disk_free_mb=300)).admitting  # floor + 64 MiB to reopen
    assert gate.judge(_use(disk_free_mb=400)).admitting


def test_the_sandbox_count_is_a_hard_cap() -> None:
    use = AdmissionGate(CAPACITY).judge(_use(sandboxes=5000))
    assert room_for(CAPACITY, use) == "sandbox budget of 5000 is used up (5000 live)"
    assert room_for(CAPACITY, _use(), "memory budget of 1000 MiB is used up") is not None


def test_free_slots_is_the_least_of_count_memory_and_threads() -> None:
    assert free_slots(CAPACITY, _use(sandboxes=10)) == (1000 - 100) // 8
    assert free_slots(CAPACITY, _use(sandboxes=10), reserved=12) == (1000 - 100) // 8 - 12
    assert free_slots(CAPACITY, _use(admitting=False)) == 0


def test_measure_counts_sandboxes_and_reads_the_host(tmp_path: Path) -> None:
    use = measure({"a": 1.0, "b": 0.5, "c": 2.0}, {"b", "c"}, tmp_path, sandbox_cpu=0.25)
    assert (use.sandboxes, use.busy, use.cpu_cores, use.sandbox_cpu) == (3, 2, 3.5, 0.25)
    assert use.memory_mb > 0 and use.pids > 0
    assert use.disk_free_mb is not None and use.disk_free_mb > 0


def test_cpu_pressure_reads_psi_some_avg10(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=1\nfull avg10=0.00\n")
    assert cpu_pressure(psi) == 12.5
    assert cpu_pressure(tmp_path / "missing") == 0.0


def test_the_budget_config_carries_the_new_limits() -> None:
    budget = NodeBudgetConfig(cpu_pressure_high=80, cpu_pressure_low=95, disk_min_free_mb=1)
    capacity = node_capacity(budget)
    assert capacity.cpu_pressure_high == 80 and capacity.cpu_pressure_low == 80
    assert capacity.disk_min_free_mb == 1


def test_headroom_says_what_is_left_or_why_closed() -> None:
    line = headroom(CAPACITY, _use(sandboxes=10, cpu_pressure=3.4))
    assert line == "112 more; cpu pressure 3%, 900 MiB, 9500 threads left"
    gate = AdmissionGate(CAPACITY)
    assert headroom(CAPACITY, gate.judge(_use(memory_mb=1200))).startswith(
        "closed: memory budget of 1000 MiB is used up"
    )


def test_the_largest_burst_is_the_most_asks_within_the_span() -> None:
    times = deque([0.0, 1.0, 2.0, 30.0, 31.0, 31.5, 32.0, 90.0])
    assert largest_burst(times, 10.0) == 4  # 30 .. 32
    assert largest_burst(deque([5.0 * i for i in range(20)]), 4.0) == 1  # a steady trickle
    assert largest_burst(deque(), 10.0) == 0


def test_the_pool_grows_only_once_the_asking_pauses() -> None:
    """Growth is for the next burst: it waits until this one stops asking."""
    asked = deque([100.0, 100.5, 101.0])
    assert not asking_paused(asked, now=102.0, pause_s=2.0)  # the burst still asks
    assert asking_paused(asked, now=103.0, pause_s=2.0)
    assert asking_paused(deque(), now=0.0, pause_s=2.0)  # nobody asked: nothing to wait for
