"""The integer program behind the intra-operator pass, solved with HiGHS.

Each group picks one option (one-hot binaries).  A pairwise cost between
two groups depends only on the *class* of each side's option (the spec a
tensor has, the spec a consumer needs), so the edge variables live on
class pairs: `e >= z_class + w_class - 1`, which is exact for a minimised
non-negative cost and much smaller than one variable per option pair.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from typing import Hashable, Mapping, Sequence

import numpy as np

# Solver numbers are microseconds: second-scale costs sit below MIP tolerances.
_SCALE = 1e6


@dataclasses.dataclass(frozen=True, eq=False)
class PairCost:
    """A cost between groups `a` and `b` that depends on the classes of their options: option k of `a` is
    in class `a_class[k]`, a row of `cost`; option k of `b` in class `b_class[k]`, a column."""

    a: int
    b: int
    a_class: tuple[int, ...]
    b_class: tuple[int, ...]
    cost: np.ndarray  # seconds, [class of a, class of b]


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
        total += float(p.cost[p.a_class[choice[p.a]], p.b_class[choice[p.b]]])
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
    return _solve_highs(problem, allowed, time_limit_s, objective, start)


def _feasible_fixed(problem: IlpProblem, choice: Sequence[int]) -> bool:
    for eq in problem.equal:
        if eq.a_key[choice[eq.a]] != eq.b_key[choice[eq.b]]:
            return False
    if problem.memory_limit is not None and peak_memory(problem, choice) > problem.memory_limit * (1 + 1e-9):
        return False
    return True


class _Program:
    """A mixed-integer program in HiGHS's own form: columns with bounds and costs, sparse rows.

    Built straight into arrays: a modelling layer's per-term objects cost several times the solve
    itself on these programs (tens of thousands of terms per layer, solved in milliseconds).
    """

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.row_start: list[int] = [0]
        self.row_index: list[int] = []
        self.row_value: list[float] = []
        self.offset = 0.0

    def column(self, cost: float = 0.0, *, binary: bool = False) -> int:
        """A new column, binary or continuous in [0, inf); its index."""
        self.cost.append(cost)
        self.upper.append(1.0 if binary else math.inf)
        self.integer.append(binary)
        return len(self.cost) - 1

    def columns(self, costs: Sequence[float]) -> range:
        """New continuous columns in [0, inf), one per cost; their indices."""
        first = len(self.cost)
        self.cost.extend(costs)
        self.upper.extend([math.inf] * len(costs))
        self.integer.extend([False] * len(costs))
        return range(first, len(self.cost))

    def row(self, terms: "_Affine", lower: float, upper: float) -> None:
        """lower <= terms <= upper, with the terms' constant moved to the bounds."""
        coefs, constant = terms
        self.row_index.extend(coefs)
        self.row_value.extend(coefs.values())
        self.row_start.append(len(self.row_index))
        self.row_lower.append(lower - constant)
        self.row_upper.append(upper - constant)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def solve(self, time_limit_s: float) -> tuple[str, list[float]]:
        """The status and the column values (empty unless a solution was found).

        The LP relaxation comes first: on these programs its optimum is almost always a 0/1 vertex
        (every GPT, MoE and WResNet layer measured), and then it is the integer optimum too, found
        3-5x faster than by the MIP solver.  Only a fractional optimum goes on to branch and bound;
        an infeasible relaxation means no assignment exists.
        """
        status, values = self._run(time_limit_s, integral=False)
        if status == "infeasible":
            return status, []
        if status == "optimal" and all(abs(values[c] - round(values[c])) <= _INTEGRAL
                                       for c, binary in enumerate(self.integer) if binary):
            return status, values
        return self._run(time_limit_s, integral=True)

    def _run(self, time_limit_s: float, integral: bool) -> tuple[str, list[float]]:
        import highspy

        _quiet_highs_banner()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.cost), self.num_rows
        lp.col_cost_ = np.asarray(self.cost)
        lp.col_lower_ = np.zeros(len(self.cost))
        lp.col_upper_ = np.asarray(self.upper)
        lp.row_lower_ = np.asarray(self.row_lower)
        lp.row_upper_ = np.asarray(self.row_upper)
        lp.offset_ = self.offset
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
        lp.a_matrix_.start_ = np.asarray(self.row_start, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(self.row_index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(self.row_value)
        if integral:
            kinds = highspy.HighsVarType
            lp.integrality_ = [kinds.kInteger if i else kinds.kContinuous for i in self.integer]
        highs = highspy.Highs()
        # These programs are near-integral at the LP root: presolve and the opening feasibility-jump
        # heuristic cost more than they save (measured ~2x on GPT/MoE/WResNet layers, same optima).
        for option, value in (("output_flag", False), ("time_limit", float(time_limit_s)),
                              ("mip_rel_gap", 1e-7), ("presolve", "off"),
                              ("mip_heuristic_run_feasibility_jump", False)):
            highs.setOptionValue(option, value)
        highs.passModel(lp)
        highs.run()
        status = highs.getModelStatus()
        found = highs.getInfo().primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
        if status == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", []
        if not found:
            return "no_solution", []  # stopped by the time limit before finding any assignment
        values = list(highs.getSolution().col_value)
        return ("optimal" if status == highspy.HighsModelStatus.kOptimal else "time_limited"), values


# How far from 0 or 1 a relaxed one-hot column may be and still count as integral.
_INTEGRAL = 1e-9


# A linear expression: {column: coefficient} and a constant.
_Affine = tuple[dict[int, float], float]


def _affine(terms: Sequence[tuple[int, float]], constant: float = 0.0) -> _Affine:
    """Sum (column, coefficient) pairs, adding the coefficients of repeated columns."""
    total: dict[int, float] = {}
    for col, coef in terms:
        total[col] = total.get(col, 0.0) + coef
    return total, constant


def _minus(a: _Affine, b: _Affine) -> _Affine:
    coefs = dict(a[0])
    for col, coef in b[0].items():
        coefs[col] = coefs.get(col, 0.0) - coef
    return coefs, a[1] - b[1]


def _solve_highs(problem: IlpProblem, allowed: list[tuple[int, ...]], time_limit_s: float,
                 objective: str, start: float) -> IlpResult:
    program = _Program()
    x: dict[tuple[int, int], int] = {}
    for g, options in enumerate(allowed):
        if len(options) > 1:
            for k in options:
                x[g, k] = program.column(binary=True)
            program.row(({x[g, k]: 1.0 for k in options}, 0.0), 1.0, 1.0)

    def indicator(g: int, options: Sequence[int]) -> _Affine:
        """1 when group g picks one of `options` (a constant when g is fixed)."""
        if len(allowed[g]) == 1:
            return {}, 1.0 if allowed[g][0] in options else 0.0
        return {x[g, k]: 1.0 for k in options if (g, k) in x}, 0.0  # options are distinct: no sums

    mem = problem.memory or tuple((0.0,) * len(u) for u in problem.unary)
    # The memory rows of the assignment, in megabytes (coefficients near the costs' scale).
    memory_rows = _affine([(x[g, k], mem[g][k] / 1e6) for g, a in enumerate(allowed) if len(a) > 1 for k in a],
                          sum(mem[g][a[0]] for g, a in enumerate(allowed) if len(a) == 1) / 1e6)
    if objective == "cost":
        _cost_objective(problem, allowed, x, indicator, program)
    else:  # the least peak: memory rows plus a bound on every working set
        largest = program.column(1.0)
        for ws in problem.working_sets:
            program.row(_minus(_working_set(ws, allowed, x), ({largest: 1.0}, 0.0)), -math.inf, 0.0)
        for col, coef in memory_rows[0].items():
            program.cost[col] += coef
        program.offset += memory_rows[1]
    for eq in problem.equal:
        if eq.a == eq.b:
            continue
        for key in {eq.a_key[k] for k in allowed[eq.a]} | {eq.b_key[k] for k in allowed[eq.b]}:
            lhs = indicator(eq.a, [k for k in allowed[eq.a] if eq.a_key[k] == key])
            rhs = indicator(eq.b, [k for k in allowed[eq.b] if eq.b_key[k] == key])
            if not lhs[0] and not rhs[0]:
                if lhs[1] != rhs[1]:
                    return IlpResult(None, "infeasible", time.perf_counter() - start, len(x), 0)
                continue
            program.row(_minus(lhs, rhs), 0.0, 0.0)
    if problem.memory_limit is not None and objective == "cost":
        limit = problem.memory_limit / 1e6
        program.row(memory_rows, -math.inf, limit)
        for ws in problem.working_sets:
            ws_terms = _working_set(ws, allowed, x)
            program.row(_affine([*memory_rows[0].items(), *ws_terms[0].items()], memory_rows[1] + ws_terms[1]),
                        -math.inf, limit)
    status, values = program.solve(time_limit_s)
    seconds = time.perf_counter() - start
    num_vars, num_cons = len(program.cost), program.num_rows
    if not values:
        return IlpResult(None, status, seconds, num_vars, num_cons)
    choice = [options[0] if len(options) == 1 else max(options, key=lambda k: values[x[g, k]])
              for g, options in enumerate(allowed)]
    return IlpResult(tuple(choice), status, seconds, num_vars, num_cons)


def _cost_objective(problem: IlpProblem, allowed: list[tuple[int, ...]], x: Mapping[tuple[int, int], int],
                    indicator, program: _Program) -> None:
    """Unary costs on the one-hot columns, pairwise costs linear in one side or on class-pair columns."""
    constant = 0.0
    for g, options in enumerate(allowed):
        if len(options) == 1:
            constant += problem.unary[g][options[0]]
        else:
            for k in options:
                program.cost[x[g, k]] += problem.unary[g][k] * _SCALE
    for p in problem.pairs:
        a_classes = _classes(p.a_class, allowed[p.a])
        b_classes = _classes(p.b_class, allowed[p.b])
        costs = p.cost[np.ix_(list(a_classes), list(b_classes))].tolist()  # over the classes still allowed
        if not any(cost > 0 for row in costs for cost in row):
            continue
        if len(a_classes) == 1 or len(b_classes) == 1:
            # One side's class is settled: the cost is linear in the other side.
            for ka, row in zip(a_classes.values(), costs):
                for kb, cost in zip(b_classes.values(), row):
                    if cost <= 0.0:
                        continue
                    coefs, fixed = indicator(*((p.b, kb) if len(a_classes) == 1 else (p.a, ka)))
                    constant += cost * fixed
                    for col in coefs:
                        program.cost[col] += cost * _SCALE
            continue
        # Joint distribution over class pairs with both marginals: a tight LP relaxation.
        e = [program.columns([cost * _SCALE for cost in row]) for row in costs]
        for row, ka in zip(e, a_classes.values()):
            program.row(_minus((dict.fromkeys(row, 1.0), 0.0), indicator(p.a, ka)), 0.0, 0.0)
        for j, kb in enumerate(b_classes.values()):
            program.row(_minus((dict.fromkeys([row[j] for row in e], 1.0), 0.0), indicator(p.b, kb)), 0.0, 0.0)
    program.offset += constant * _SCALE


def _working_set(ws: WorkingSet, allowed: Sequence[Sequence[int]], x: Mapping[tuple[int, int], int]) -> _Affine:
    """One operator's working set in megabytes under the assignment."""
    constant, terms = ws
    fixed = constant + sum(b for g, k, b in terms if len(allowed[g]) == 1 and allowed[g][0] == k)
    return _affine([(x[g, k], b / 1e6) for g, k, b in terms if (g, k) in x], fixed / 1e6)


def _classes(classes: tuple[int, ...], options: Sequence[int]) -> dict[int, list[int]]:
    """Each class among `options`, in first-seen order, with its options."""
    out: dict[int, list[int]] = {}
    for k in options:
        out.setdefault(classes[k], []).append(k)
    return out


@functools.lru_cache(maxsize=None)
def _quiet_highs_banner() -> None:
    """Let HiGHS print its once-per-process copyright banner into /dev/null.

    `output_flag=False` cannot stop it: the banner comes from the C++
    constructor, before any option is set, straight to file descriptor 1.
    """
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
