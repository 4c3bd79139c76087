"""UserCallable: construct, call, check and reconfigure the user's code, without Ray."""

from __future__ import annotations

import asyncio
import threading

import pytest

from replicas.user_callable import UserCallable, call_maybe_async


class Counter:
    def __init__(self, start: int = 0, *, step: int = 1) -> None:
        self.value = start
        self.step = step
        self.config = None
        self.constructed_on = threading.get_ident()

    def bump(self, times: int = 1) -> int:
        self.value += self.step * times
        return self.value

    async def bump_async(self, times: int = 1) -> int:
        await asyncio.sleep(0)
        self.value += self.step * times
        return self.value

    def state(self) -> dict:
        return {"value": self.value, "step": self.step, "config": self.config,
                "constructed_on": self.constructed_on}

    def thread(self) -> int:
        return threading.get_ident()

    async def thread_async(self) -> int:
        return threading.get_ident()

    def returns_coroutine(self):
        return self.bump_async(10)

    def reconfigure(self, config) -> None:
        self.config = config


class AsyncConfigured:
    def __init__(self) -> None:
        self.config = None
        self.healthy = True

    async def reconfigure(self, config) -> None:
        self.config = config

    def get_config(self):
        return self.config

    def break_it(self) -> None:
        self.healthy = False

    async def check_health(self) -> None:
        if not self.healthy:
            raise RuntimeError("model unloaded")


class Unhealthy:
    def check_health(self) -> None:
        raise RuntimeError("gpu lost")


class NoHooks:
    pass


class FailsToConstruct:
    def __init__(self) -> None:
        raise ValueError("weights missing")


def double(x: int) -> int:
    return 2 * x


async def double_async(x: int) -> int:
    return 2 * x


async def constructed(target, *args, **kwargs) -> UserCallable:
    user = UserCallable(target, args, kwargs)
    await user.construct()
    return user


def run(coro):
    return asyncio.run(coro)


def test_class_is_constructed_with_its_args_off_the_event_loop_thread():
    async def scenario():
        user = await constructed(Counter, 5, step=2)
        return user.is_function, await user.call("state", (), {}), threading.get_ident()

    is_function, state, loop_thread = run(scenario())
    assert not is_function
    assert (state["value"], state["step"]) == (5, 2)
    assert state["constructed_on"] != loop_thread


def test_resolve_arg_is_applied_to_every_init_arg():
    async def scenario():
        user = UserCallable(Counter, ("five",), {"step": "two"},
                            resolve_arg=lambda v: {"five": 5, "two": 2}[v])
        await user.construct()
        return await user.call("state", (), {})

    state = run(scenario())
    assert (state["value"], state["step"]) == (5, 2)


def test_sync_and_async_methods_are_called_with_their_args():
    async def scenario():
        user = await constructed(Counter, 0, step=3)
        first = await user.call("bump", (2,), {})
        second = await user.call("bump_async", (), {"times": 1})
        return first, second

    assert run(scenario()) == (6, 9)


def test_sync_methods_run_in_a_worker_thread_and_async_ones_on_the_loop():
    async def scenario():
        user = await constructed(Counter)
        return (threading.get_ident(), await user.call("thread", (), {}),
                await user.call("thread_async", (), {}))

    loop_thread, sync_thread, async_thread = run(scenario())
    assert sync_thread != loop_thread
    assert async_thread == loop_thread


def test_sync_method_returning_an_awaitable_is_awaited():
    async def scenario():
        user = await constructed(Counter)
        return await user.call("returns_coroutine", (), {})

    assert run(scenario()) == 10


def test_unknown_method_is_an_attribute_error_naming_it():
    async def scenario():
        user = await constructed(Counter)
        await user.call("nope", (), {})

    with pytest.raises(AttributeError, match="no method 'nope'"):
        run(scenario())


def test_user_exception_propagates_from_construct():
    with pytest.raises(ValueError, match="weights missing"):
        run(constructed(FailsToConstruct))


@pytest.mark.parametrize("fn", [double, double_async])
def test_function_deployment_is_called_as_call_and_has_no_other_methods(fn):
    async def scenario():
        user = await constructed(fn)
        result = await user.call("__call__", (21,), {})
        with pytest.raises(AttributeError):
            await user.call("bump", (), {})
        await user.check_health()  # no check_health: healthy
        await user.reconfigure(None)  # no user_config: nothing to do
        return user, result

    user, result = run(scenario())
    assert user.is_function and result == 42


def test_reconfigure_hands_user_config_to_sync_and_async_methods():
    async def scenario():
        sync_user = await constructed(Counter)
        async_user = await constructed(AsyncConfigured)
        await sync_user.reconfigure({"t": 1})
        await async_user.reconfigure({"t": 2})
        return ((await sync_user.call("state", (), {}))["config"],
                await async_user.call("get_config", (), {}))

    assert run(scenario()) == ({"t": 1}, {"t": 2})


@pytest.mark.parametrize("target", [NoHooks, double])
def test_reconfigure_missing_while_user_config_set_is_a_helpful_type_error(target):
    async def scenario():
        user = await constructed(target)
        await user.reconfigure({"greeting": "hi"})

    with pytest.raises(TypeError) as info:
        run(scenario())
    message = str(info.value)
    assert "user_config is set" in message and "reconfigure(user_config)" in message
    assert "drop user_config" in message


def test_reconfigure_missing_without_user_config_is_fine():
    async def scenario():
        user = await constructed(NoHooks)
        await user.reconfigure(None)
        await user.check_health()

    run(scenario())


def test_check_health_raising_propagates():
    async def scenario():
        user = await constructed(Unhealthy)
        await user.check_health()

    with pytest.raises(RuntimeError, match="gpu lost"):
        run(scenario())


def test_async_check_health_raising_propagates():
    async def scenario():
        user = await constructed(AsyncConfigured)
        await user.check_health()  # healthy: returns
        await user.call("break_it", (), {})
        await user.check_health()

    with pytest.raises(RuntimeError, match="model unloaded"):
        run(scenario())


def test_call_maybe_async_passes_args_to_plain_callables():
    assert run(call_maybe_async(lambda a, b=0: a + b, 1, b=2)) == 3
    assert run(call_maybe_async(double_async, 4)) == 8


class RoutingStats:
    def __init__(self, stats) -> None:
        self.stats = stats

    def record_routing_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


class AsyncRoutingStats:
    async def record_routing_stats(self):  # may wait: never called by a probe
        return {"kv_cache_usage": 0.5}


@pytest.mark.parametrize("target, args, usage", [
    (RoutingStats, ({"kv_cache_usage": 0.4},), 0.4), (RoutingStats, ({},), None),
    (RoutingStats, ({"kv_cache_usage": "high"},), None),
    (RoutingStats, (RuntimeError("broken"),), None), (AsyncRoutingStats, (), None),
    (double, (), None)])
def test_kv_cache_use_comes_only_from_a_plain_routing_stats_hook(target, args, usage):
    user = run(constructed(target, *args))
    assert user.kv_cache_usage() == usage


class AutoscalingStats:
    def __init__(self, stats) -> None:
        self.stats = stats

    def record_autoscaling_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


@pytest.mark.parametrize("stats, sent", [
    ({"running": 2, "waiting": 1.5}, {"running": 2.0, "waiting": 1.5}),
    ({"running": True}, None), ({"running": "2"}, None), ([1, 2], None),
    (RuntimeError("broken"), None)])
def test_autoscaling_stats_are_a_plain_hooks_numbers_or_nothing(stats, sent):
    user = run(constructed(AutoscalingStats, stats))
    assert user.autoscaling_stats() == sent
