"""The integer program behind the intra-operator pass, solved with pulp.

Each group picks one option (one-hot binaries).  A pairwise cost between
two groups depends only on the *class* of each side's option (the spec a
tensor has, the spec a consumer needs), so the edge variables live on
class pairs: `e >= z_class + w_class - 1`, which is exact for a minimised
non-negative cost and much smaller than one variable per option pair.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
import warnings
from typing import Hashable, Mapping, Sequence

# Solver numbers are microseconds: second-scale costs sit below MIP tolerances.
_SCALE = 1e6


@dataclasses.dataclass(frozen=True)
class PairCost:
    """A cost between groups `a` and `b` that depends on the classes of their options."""

    a: int
    b: int
    a_class: tuple[Hashable, ...]
    b_class: tuple[Hashable, ...]
    cost: Mapping[tuple[Hashable, Hashable], float]


@dataclasses.dataclass(frozen=True)
class Equal:
    """Groups `a` and `b` must pick options with equal keys (a parameter and its update)."""

    a: int
    b: int
    a_key: tuple[Hashable, ...]
    b_key: tuple[Hashable, ...]


# One operator's transient bytes: (constant, ((group, option, bytes), ...)).
WorkingSet = tuple[float, tuple[tuple[int, int, float], ...]]


@dataclasses.dataclass(frozen=True)
class IlpProblem:
    unary: tuple[tuple[float, ...], ...]
    allowed: tuple[tuple[int, ...], ...]
    pairs: tuple[PairCost, ...]
    equal: tuple[Equal, ...] = ()
    memory: tuple[tuple[float, ...], ...] | None = None
    memory_limit: float | None = None
    constant: float = 0.0
    # The peak is the memory rows plus the largest working set.
    working_sets: tuple[WorkingSet, ...] = ()


def working_set_bytes(working_set: WorkingSet, choice: Sequence[int]) -> float:
    """One operator's transient bytes under an assignment: the constant plus the terms it picks."""
    constant, terms = working_set
    return constant + sum(b for g, k, b in terms if choice[g] == k)


def peak_memory(problem: IlpProblem, choice: Sequence[int]) -> float:
    """The memory rows of one assignment plus its largest working set (what the memory limit bounds)."""
    used = sum(problem.memory[g][k] for g, k in enumerate(choice)) if problem.memory else 0.0
    return used + max((working_set_bytes(ws, choice) for ws in problem.working_sets), default=0.0)


@dataclasses.dataclass(frozen=True)
class IlpResult:
    choice: tuple[int, ...] | None
    status: str  # "optimal" | "time_limited" | "pinned" | "infeasible" | "no_solution"
    seconds: float
    num_variables: int
    num_constraints: int


def evaluate(problem: IlpProblem, choice: Sequence[int]) -> float:
    """The objective of one assignment, computed directly (no solver)."""
    total = problem.constant + sum(problem.unary[g][k] for g, k in enumerate(choice))
    for p in problem.pairs:
        total += p.cost.get((p.a_class[choice[p.a]], p.b_class[choice[p.b]]), 0.0)
    return total


def _restricted(problem: IlpProblem) -> list[tuple[int, ...]] | None:
    """Allowed options after alias constraints between fixed or identical groups; None if empty."""
    allowed = [tuple(a) for a in problem.allowed]
    for eq in problem.equal:
        if eq.a == eq.b:
            allowed[eq.a] = tuple(k for k in allowed[eq.a] if eq.a_key[k] == eq.b_key[k])
    if any(not a for a in allowed):
        return None
    return allowed


def solve(problem: IlpProblem, time_limit_s: float = 60.0, objective: str = "cost") -> IlpResult:
    """Minimise the total cost (or with `objective="memory"`, the memory) over one option per group."""
    start = time.perf_counter()
    allowed = _restricted(problem)
    if allowed is None:
        return IlpResult(None, "infeasible", time.perf_counter() - start, 0, 0)
    if all(len(a) == 1 for a in allowed):
        choice = tuple(a[0] for a in allowed)
        status = "pinned" if _feasible_fixed(problem, choice) else "infeasible"
        return IlpResult(choice if status == "pinned" else None, status, time.perf_counter() - start, 0, 0)
    with warnings.catch_warnings():
        # pulp 3.x announces its 4.0 API on every variable; the 3.x calls used here still work.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _solve_pulp(problem, allowed, time_limit_s, objective, start)


def _feasible_fixed(problem: IlpProblem, choice: Sequence[int]) -> bool:
    for eq in problem.equal:
        if eq.a_key[choice[eq.a]] != eq.b_key[choice[eq.b]]:
            return False
    if problem.memory_limit is not None and peak_memory(problem, choice) > problem.memory_limit * (1 + 1e-9):
        return False
    return True


def _solve_pulp(problem: IlpProblem, allowed: list[tuple[int, ...]], time_limit_s: float,
                objective: str, start: float) -> IlpResult:
    import pulp

    model = pulp.LpProblem("sharding", pulp.LpMinimize)
    x: dict[tuple[int, int], pulp.LpVariable] = {}
    terms: list = []
    constant = 0.0
    for g, options in enumerate(allowed):
        if len(options) > 1:
            for k in options:
                x[g, k] = pulp.LpVariable(f"x{g}_{k}", cat="Binary")
            model += pulp.lpSum(x[g, k] for k in options) == 1, f"one{g}"

    def indicator(g: int, options: Sequence[int]):
        """1 when group g picks one of `options`: an expression, or a 0/1 constant when fixed."""
        if len(allowed[g]) == 1:
            return 1.0 if allowed[g][0] in options else 0.0
        return pulp.lpSum(x[g, k] for k in options if (g, k) in x)

    def memory_rows():
        """The memory rows of the assignment, in megabytes (an expression plus a constant)."""
        mem = problem.memory or tuple((0.0,) * len(u) for u in problem.unary)
        fixed = sum(mem[g][a[0]] for g, a in enumerate(allowed) if len(a) == 1)
        return _affine([(x[g, k], mem[g][k] / 1e6) for g, a in enumerate(allowed) if len(a) > 1 for k in a]) \
            + fixed / 1e6

    if objective == "cost":
        for g, options in enumerate(allowed):
            if len(options) == 1:
                constant += problem.unary[g][options[0]]
            else:
                terms.extend((x[g, k], problem.unary[g][k] * _SCALE) for k in options)
        num_edges = 0
        for p in problem.pairs:
            a_classes = _classes(p.a_class, allowed[p.a])
            b_classes = _classes(p.b_class, allowed[p.b])
            if not any(p.cost.get((ca, cb), 0.0) > 0 for ca in a_classes for cb in b_classes):
                continue
            if len(a_classes) == 1 or len(b_classes) == 1:
                # One side's class is settled: the cost is linear in the other side.
                for (ca, ka), (cb, kb) in ((a, b) for a in a_classes.items() for b in b_classes.items()):
                    cost = p.cost.get((ca, cb), 0.0)
                    if cost <= 0.0:
                        continue
                    varying = (p.b, kb) if len(a_classes) == 1 else (p.a, ka)
                    z = indicator(*varying)
                    if isinstance(z, float):
                        constant += cost * z
                    else:
                        terms.extend((v, cost * _SCALE) for v in _vars(z))
                continue
            # Joint distribution over class pairs with both marginals: a tight LP relaxation.
            e = {}
            for ca in a_classes:
                for cb in b_classes:
                    e[ca, cb] = pulp.LpVariable(f"e{num_edges}", lowBound=0)
                    num_edges += 1
                    cost = p.cost.get((ca, cb), 0.0)
                    if cost > 0.0:
                        terms.append((e[ca, cb], cost * _SCALE))
            for ca, ka in a_classes.items():
                model += pulp.lpSum(e[ca, cb] for cb in b_classes) == indicator(p.a, ka)
            for cb, kb in b_classes.items():
                model += pulp.lpSum(e[ca, cb] for ca in a_classes) == indicator(p.b, kb)
        model += _affine(terms) + constant * _SCALE
    else:  # the least peak: memory rows plus a bound on every working set
        largest = pulp.LpVariable("largest_working_set", lowBound=0)
        for j, ws in enumerate(problem.working_sets):
            model += _working_set(ws, allowed, x) <= largest, f"working{j}"
        model += memory_rows() + largest
    for i, eq in enumerate(problem.equal):
        if eq.a == eq.b:
            continue
        keys = {eq.a_key[k] for k in allowed[eq.a]} | {eq.b_key[k] for k in allowed[eq.b]}
        for j, key in enumerate(keys):
            lhs = indicator(eq.a, [k for k in allowed[eq.a] if eq.a_key[k] == key])
            rhs = indicator(eq.b, [k for k in allowed[eq.b] if eq.b_key[k] == key])
            if isinstance(lhs, float) and isinstance(rhs, float):
                if lhs != rhs:
                    return IlpResult(None, "infeasible", time.perf_counter() - start, len(x), 0)
                continue
            model += lhs == rhs, f"alias{i}_{j}"
    if problem.memory_limit is not None and objective == "cost":
        # Megabytes keep the coefficients near the costs' scale.
        limit = problem.memory_limit / 1e6
        rows = memory_rows()
        model += rows <= limit, "memory"
        for j, ws in enumerate(problem.working_sets):
            model += rows + _working_set(ws, allowed, x) <= limit, f"memory{j}"
    status = _run(model, time_limit_s)
    seconds = time.perf_counter() - start
    num_vars, num_cons = len(model.variables()), len(model.constraints)
    if status in ("infeasible", "no_solution"):
        return IlpResult(None, status, seconds, num_vars, num_cons)
    choice = []
    for g, options in enumerate(allowed):
        if len(options) == 1:
            choice.append(options[0])
        else:
            choice.append(max(options, key=lambda k: x[g, k].value() or 0.0))
    return IlpResult(tuple(choice), status, seconds, num_vars, num_cons)


def _working_set(ws, allowed: Sequence[Sequence[int]], x: Mapping) -> object:
    """One operator's working set in megabytes under the assignment `x`."""
    constant, terms = ws
    fixed = constant + sum(b for g, k, b in terms if len(allowed[g]) == 1 and allowed[g][0] == k)
    return _affine([(x[g, k], b / 1e6) for g, k, b in terms if (g, k) in x]) + fixed / 1e6


def _classes(classes: tuple[Hashable, ...], options: Sequence[int]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = {}
    for k in options:
        out.setdefault(classes[k], []).append(k)
    return out


def _affine(terms: list):
    """Sum (variable, coefficient) pairs; pulp's constructor would keep only the last of duplicates."""
    import pulp

    total: dict = {}
    for var, coef in terms:
        total[var] = total.get(var, 0.0) + coef
    return pulp.LpAffineExpression(list(total.items()))


def _vars(expr) -> list:
    return list(expr.keys())


@functools.lru_cache(maxsize=None)
def _quiet_highs_banner() -> None:
    """Let HiGHS print its once-per-process copyright banner into /dev/null.

    `msg=False` cannot stop it: the banner comes from the C++ constructor,
    before any option is set, straight to file descriptor 1.
    """
    try:
        import highspy
    except ImportError:
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _run(model, time_limit_s: float) -> str:
    """Solve with HiGHS when available (faster on one-hot programs), else CBC."""
    import pulp

    _quiet_highs_banner()

    # These programs are near-integral at the LP root: HiGHS's presolve and its opening feasibility-jump
    # heuristic cost more than they save (measured ~2x on GPT/MoE/WResNet layers, same optima).
    highs = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=1e-7, presolve="off",
                       mip_heuristic_run_feasibility_jump=False)
    solver = highs if highs.available() else pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=1e-7)
    model.solve(solver)
    if model.status == pulp.LpStatusInfeasible:
        return "infeasible"
    solution = pulp.LpSolution.get(model.sol_status, "")
    if solution == "Optimal Solution Found":
        return "optimal"
    if model.status == pulp.LpStatusOptimal or solution in ("Solution Found",):
        return "time_limited"
    return "no_solution"  # stopped by the time limit before finding any assignment
