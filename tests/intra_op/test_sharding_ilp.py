"""The one-hot program itself, against brute force on random problems with every kind of row it builds."""

import itertools
import random

import numpy as np
import pytest

from alpaviz.core.intra_op._sharding_ilp import Equal, IlpProblem, PairCost, evaluate, peak_memory, solve


def _random_problem(seed: int, *, memory_limit: bool) -> IlpProblem:
    """Five groups of two to four options, with class-pair costs, an alias, memory and (even seeds) working sets."""
    rng = random.Random(seed)
    sizes = [rng.randint(2, 4) for _ in range(5)]
    unary = tuple(tuple(rng.uniform(0, 1e-3) for _ in range(n)) for n in sizes)
    classes = [tuple(rng.randint(0, 1) for _ in range(n)) for n in sizes]
    pairs = tuple(
        PairCost(a, b, classes[a], classes[b], np.array([[rng.choice([0.0, rng.uniform(0, 2e-3)]) for cb in (0, 1)]
                                                         for ca in (0, 1)]))
        for a, b in ((0, 1), (1, 2), (2, 3), (0, 4), (3, 4))
    )
    equal = (Equal(1, 3, classes[1], classes[3]),)
    memory = tuple(tuple(rng.uniform(1e6, 4e6) for _ in range(n)) for n in sizes)
    working_sets = tuple(
        (rng.uniform(0, 1e6), tuple((g, k, rng.uniform(0, 3e6)) for g in rng.sample(range(5), 2)
                                    for k in range(sizes[g]) if rng.random() < 0.6))
        for _ in range(3)
    )
    working_sets = working_sets if seed % 2 == 0 else ()  # odd seeds: the memory rows alone bound the peak
    allowed = tuple(tuple(range(n)) for n in sizes)
    problem = IlpProblem(unary, allowed, pairs, equal, memory, None, 1e-4, working_sets)
    if memory_limit:
        peaks = sorted(peak_memory(problem, c) for c in _assignments(problem))
        problem = IlpProblem(unary, allowed, pairs, equal, memory, peaks[len(peaks) // 3], 1e-4, working_sets)
    return problem


def _assignments(problem):
    for choice in itertools.product(*problem.allowed):
        if all(eq.a_key[choice[eq.a]] == eq.b_key[choice[eq.b]] for eq in problem.equal):
            yield choice


def _within_limit(problem, choice):
    return problem.memory_limit is None or peak_memory(problem, choice) <= problem.memory_limit * (1 + 1e-9)


@pytest.mark.parametrize("memory_limit", [False, True], ids=["free", "memory_limited"])
@pytest.mark.parametrize("seed", range(6))
def test_the_least_cost_matches_brute_force(seed, memory_limit):
    problem = _random_problem(seed, memory_limit=memory_limit)
    best = min(evaluate(problem, c) for c in _assignments(problem) if _within_limit(problem, c))
    result = solve(problem)
    assert result.status == "optimal" and result.num_variables > 0
    assert all(eq.a_key[result.choice[eq.a]] == eq.b_key[result.choice[eq.b]] for eq in problem.equal)
    assert _within_limit(problem, result.choice)
    assert evaluate(problem, result.choice) == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_the_least_memory_matches_brute_force(seed):
    problem = _random_problem(seed, memory_limit=False)
    lowest = min(peak_memory(problem, c) for c in _assignments(problem))
    result = solve(problem, objective="memory")
    assert result.status == "optimal"
    assert peak_memory(problem, result.choice) == pytest.approx(lowest, rel=1e-6)


def test_a_limit_below_every_assignment_is_infeasible():
    problem = _random_problem(0, memory_limit=False)
    lowest = min(peak_memory(problem, c) for c in _assignments(problem))
    tight = IlpProblem(problem.unary, problem.allowed, problem.pairs, problem.equal, problem.memory,
                       lowest * 0.99, problem.constant, problem.working_sets)
    result = solve(tight)
    assert result.status == "infeasible" and result.choice is None


def test_the_relaxation_answers_when_integral_and_branch_and_bound_when_not(monkeypatch):
    """Both paths of the LP-first solve are taken on the random problems, and each meets brute force."""
    from alpaviz.core.intra_op import _sharding_ilp

    runs: list[list[bool]] = []
    real_run = _sharding_ilp._Program._run

    def recording_run(self, time_limit_s, integral):
        runs[-1].append(integral)
        return real_run(self, time_limit_s, integral)

    monkeypatch.setattr(_sharding_ilp._Program, "_run", recording_run)
    for seed in range(12):
        if not any(_assignments(_random_problem(seed, memory_limit=False))):
            continue  # the alias rules out every assignment: no limit to draw
        for memory_limit in (False, True):
            problem = _random_problem(seed, memory_limit=memory_limit)
            costs = [evaluate(problem, c) for c in _assignments(problem) if _within_limit(problem, c)]
            runs.append([])
            result = solve(problem)
            assert result.status == "optimal" and _within_limit(problem, result.choice)
            assert evaluate(problem, result.choice) == pytest.approx(min(costs), rel=1e-6)
    assert [False] in runs and [False, True] in runs, runs
