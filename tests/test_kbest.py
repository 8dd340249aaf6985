"""The k best paths of a stage graph equal the k best of every path, listed by brute force."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_opt.search.kbest import k_best_paths
from amp_opt.search.partition import every_path as listed, path_value
from tests.test_partition import random_graph


def every_path(g):
    """Every feasible path of g with its value, by listing them all, best first."""
    return sorted(listed(g), key=lambda vp: vp[0])


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10**6), L=st.integers(1, 6), p=st.integers(1, 4), states=st.integers(1, 3),
       n=st.sampled_from([1, 2, 8]), schedule=st.sampled_from(["closed", "1f1b", "random"]),
       k=st.integers(1, 12))
def test_k_best_paths_equal_the_k_best_of_every_path(seed, L, p, states, n, schedule, k):
    p = min(p, L)
    g = random_graph(seed, L, p, states, n, schedule)
    brute = every_path(g)
    found = list(itertools.islice(k_best_paths(g), k))
    assert len(found) == min(k, len(brute))
    assert len({(f[1].transitions, f[1].boundaries) for f in found}) == len(found)  # each path once
    for (value, path), (expected, _) in zip(found, brute):
        assert value == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert path_value(g, path) == pytest.approx(value, rel=1e-12, abs=1e-15)


def test_a_limit_ends_the_paths_below_it():
    g = random_graph(7, 6, 3, 2, 8, "1f1b")
    brute = every_path(g)
    limit = brute[min(4, len(brute) - 1)][0]
    found = [v for v, _ in k_best_paths(g, limit=lambda: limit)]
    assert found == pytest.approx([v for v, _ in brute if v < limit])
