"""Erlang C sizing (``controlplane/deployment/erlang.py``): closed forms and the counts the
LLM autoscaling policy asks for. Pure."""

from __future__ import annotations

import math

import pytest

from controlplane.deployment.erlang import engines_for, late_share


@pytest.mark.parametrize("load", [0.1, 0.5, 0.9])
def test_one_server_is_m_m_1(load):
    # M/M/1: P(wait) = rho, the wait given one is exponential at rate (1 - rho) / s
    assert late_share(1, load, 20.0, 5.0) == pytest.approx(load * math.exp(-(1 - load) * 5 / 20))


def test_two_servers_match_the_closed_form():
    a = 1.2  # Erlang C for c = 2: a^2 / (a^2 + (2 - a)(1 + a))
    c = a * a / (a * a + (2 - a) * (1 + a))
    assert late_share(2, a, 10.0, 0.0) == pytest.approx(c)


def test_no_load_never_waits_and_a_load_at_capacity_always_does():
    assert late_share(4, 0.0, 20.0, 1.0) == 0.0
    assert late_share(4, 4.0, 20.0, 1.0) == 1.0 and late_share(4, 9.0, 20.0, 1.0) == 1.0


@pytest.mark.parametrize("load, want", [(0.5, 1), (1.0, 2), (10.0, 5), (100.0, 28)])
def test_the_counts_the_module_states(load, want):
    assert engines_for(load, 4, 21.0, 10.0, 0.001, 1, 200) == want


def test_the_count_is_the_fewest_that_meet_the_bound_and_rises_with_the_load():
    counts = [engines_for(a / 4, 4, 21.0, 10.0, 0.001, 1, 200) for a in range(1, 400)]
    assert counts == sorted(counts)
    for a, n in zip(range(1, 400, 37), counts[::37]):
        load = a / 4
        assert late_share(4 * n, load, 21.0, 10.0) <= 0.001
        assert n == 1 or late_share(4 * (n - 1), load, 21.0, 10.0) > 0.001


def test_first_and_most_bound_the_search():
    assert engines_for(10.0, 4, 21.0, 10.0, 0.001, 7, 200) == 7  # at least first
    assert engines_for(1000.0, 4, 21.0, 10.0, 0.001, 1, 12) == 12  # none enough: most
    assert engines_for(0.0, 4, 21.0, 10.0, 0.001, 0, 12) == 0
