"""Background work on a node waits for its steps: a quiet moment after the last
step, or the longest wait, whichever comes first. A fake clock drives it."""

from __future__ import annotations

import asyncio

from activities.foreground import Foreground


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_node_that_never_ran_a_step_is_quiet() -> None:
    assert Foreground(clock=FakeClock()).is_quiet()


def test_a_step_holds_the_node_and_the_settle_time_follows_it() -> None:
    clock = FakeClock()
    foreground = Foreground(settle_s=0.05, clock=clock)
    with foreground.held():
        clock.now += 10
        assert not foreground.is_quiet()
    clock.now += 0.04
    assert not foreground.is_quiet()
    clock.now += 0.02
    assert foreground.is_quiet()


def test_a_warm_claim_counts_as_the_start_of_its_first_step() -> None:
    clock = FakeClock()
    foreground = Foreground(settle_s=0.05, clock=clock)
    foreground.touch()
    assert not foreground.is_quiet()
    clock.now += 0.06
    assert foreground.is_quiet()


def test_quiet_returns_once_the_step_ends() -> None:
    async def scenario() -> list[str]:
        foreground = Foreground(settle_s=0.01, max_wait_s=10)
        order: list[str] = []

        async def step() -> None:
            with foreground.held():
                await asyncio.sleep(0.05)
                order.append("step ended")

        async def background() -> None:
            await asyncio.sleep(0)  # the step starts first
            await foreground.quiet()
            order.append("background ran")

        await asyncio.gather(step(), background())
        return order

    assert asyncio.run(scenario()) == ["step ended", "background ran"]


def test_quiet_gives_up_waiting_on_a_node_that_is_never_quiet() -> None:
    async def scenario() -> bool:
        foreground = Foreground(settle_s=0.01, max_wait_s=0.05)
        with foreground.held():
            await asyncio.wait_for(foreground.quiet(), timeout=5)
            return foreground.is_quiet()

    assert asyncio.run(scenario()) is False  # it returned while the step still ran
