import json

import pytest

import alpaviz as av
from alpaviz.core import Layer, PredictedCost, Schedule, SolverInfo, Stage, StageCost
from alpaviz.core.plan import minimal_conflict


def _hand_plan(pins=av.Pins()):
    cost = StageCost(1e-3, 2e-3, 1e-4, 2.5e-3, 5e-4, 1e-4, 2e9, 1e8)
    stages = (
        Stage(0, 0, 2, (1, 4), (0, 1, 2, 3), (2, 2), (("n0_dot_general", "SS = SR x RS"),),
              (("params.w0", (("x",), ("y",))),), cost),
        Stage(1, 2, 3, (1, 4), (4, 5, 6, 7), (4, 1), (), (("x", (("x",), ())),), cost),
    )
    return av.Plan(
        model="toy",
        graph_fingerprint="abc",
        cluster=av.Cluster.a100_node(1),
        cost_model=av.CostModel(),
        layers=tuple(Layer(i, (f"n{i}_dot_general",), 1e9) for i in range(3)),
        stages=stages,
        schedule=Schedule("1f1b", 4),
        predicted=PredictedCost(0.01, 0.008, 0.001, 0.0005, 0.0002, 0.003, 2e9, 40e9),
        pins=pins,
        solver=SolverInfo("optimal", 0.5, 0.01, ("hand made",)),
    )


def test_plan_json_round_trip_is_exact():
    pins = av.Pins().with_cut(2).with_strategy("n0_dot_general", "SS = SR x RS").with_submesh(1, (1, 4), (4, 1))
    plan = _hand_plan(pins)
    again = av.Plan.from_json(plan.to_json())
    assert again == plan
    assert hash(again) == hash(plan)
    assert again.stage_cuts == (2,)
    assert again.stage_of_node("n2_dot_general").index == 1
    assert "stage" in plan.summary() and "pinned: cut before layer 2" in plan.summary()


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["stages"][1].update(submesh=[1, 4, 2]), r"plan.stages\[1\].submesh: expected 2 items"),
        (lambda d: d["schedule"].update(kind="zigzag"), r"plan.schedule.kind"),
        (lambda d: d["cluster"].pop("device"), r"plan.cluster.device: missing"),
        (lambda d: d["predicted"].update(step_time_s="fast"), r"plan.predicted.step_time_s: expected a number"),
        (lambda d: d.update(colour="red"), r"unknown field\(s\) \['colour'\]"),
        (lambda d: d["stages"][1].update(layer_start=1), r"stages must tile"),
    ],
    ids=["version", "submesh", "schedule", "missing", "type", "unknown", "tiling"],
)
def test_bad_plan_json_names_the_field(mutate, message):
    data = json.loads(_hand_plan().to_json())
    mutate(data)
    with pytest.raises(av.PlanFormatError, match=message):
        av.Plan.from_json(json.dumps(data))


def test_not_json_is_refused():
    with pytest.raises(av.PlanFormatError, match="not valid JSON"):
        av.Plan.from_json("{stages: oops")


def test_brackets_inside_strings_do_not_count_as_nesting():
    """Stage labels may hold brackets and escaped quotes; only the document's own brackets nest."""
    label = 'x\\"' + "[" * 40 + '\\' * 2  # an escaped quote, 40 brackets, an escaped backslash
    data = json.loads(_hand_plan().to_json())
    data["model"] = label
    assert av.Plan.from_json(json.dumps(data)).model == label
    with pytest.raises(av.PlanFormatError, match="nested 33 levels"):  # outside a string they count
        av.Plan.from_json("[" * 33 + "]" * 33)


def test_pins_are_frozen_and_edits_return_new_pins():
    pins = av.Pins()
    p2 = pins.with_cut(3).with_cut(1).with_strategy("n1", "RR").with_partition_spec("params.w", (("x",), ()))
    assert pins.is_empty and not p2.is_empty
    assert p2.stage_cuts == (1, 3)
    assert p2.without_cut(3).stage_cuts == (1,)
    assert p2.with_no_cut(1).stage_cuts == (3,) and p2.with_no_cut(1).forbidden_cuts == (1,)
    assert p2.with_strategy("n1", None).strategies == ()
    assert av.Pins.from_json(p2.to_json()) == p2
    with pytest.raises(AttributeError):
        p2.num_stages = 3  # type: ignore[misc]


def test_pins_take_mappings_as_a_user_writes_them():
    written = av.Pins(strategies={"n0_dot_general": "SS = SR x RS"}, stage_submeshes={1: (1, 4)},
                      stage_remat={0: True}, partition_specs={"params.w": (("x",), ())})
    assert written == (av.Pins().with_strategy("n0_dot_general", "SS = SR x RS").with_submesh(1, (1, 4))
                       .with_remat(0, True).with_partition_spec("params.w", (("x",), ())))
    assert av.Pins.from_json(written.to_json()) == written


def test_pins_atoms_describe_and_reunite_every_pin():
    pins = (av.Pins(num_stages=3, num_microbatches=4).with_cut(2).with_no_cut(1).with_submesh(0, (1, 2), (2, 1))
            .with_remat(1, False).with_strategy("n3", "RR").with_partition_spec("params.w", ((), ())))
    atoms = pins.atoms()
    assert [label for label, _ in atoms] == pins.describe()
    assert len(atoms) == 9, "one atom per pin, the intra-op ones included"
    assert all(len(atom.atoms()) == 1 for _, atom in atoms)
    assert av.Pins.union([atom for _, atom in atoms]) == pins
    assert av.Pins.union([]) == av.Pins()
    with pytest.raises(av.InfeasiblePinsError, match="num_stages is pinned to each of"):
        av.Pins.union([av.Pins(num_stages=2), av.Pins(num_stages=3)])
    with pytest.raises(av.InfeasiblePinsError, match="'n3' is pinned to both 'RR' and 'SR'"):
        av.Pins.union([av.Pins().with_strategy("n3", "RR"), av.Pins().with_strategy("n3", "SR")])


def test_minimal_conflict_keeps_only_what_the_conflict_needs():
    # Items conflict when both 2 and 5 are present, or when 7 is: the filter keeps a minimal such set.
    conflicts = lambda some: {2, 5} <= set(some) or 7 in some  # noqa: E731
    assert minimal_conflict([1, 2, 3, 5, 7], conflicts) == [7]
    assert minimal_conflict([1, 2, 3, 5], conflicts) == [2, 5]
    kept = minimal_conflict([7, 2, 5], conflicts)
    assert conflicts(kept) and all(not conflicts([x for x in kept if x != y]) for y in kept)


def test_conflicting_pins_are_explained():
    with pytest.raises(ValueError, match="both as a cut and as no-cut"):
        av.Pins(stage_cuts=(2,), forbidden_cuts=(2,))
    with pytest.raises(ValueError, match="num_stages is pinned to 2"):
        av.Pins(stage_cuts=(1, 2), num_stages=2)
    with pytest.raises(ValueError, match="layer index >= 1"):
        av.Pins(stage_cuts=(0,))


def test_spec_helpers():
    from alpaviz.core import make_spec, spec_name, to_partition_spec
    from alpaviz.core.plan._spec import check_spec, shard_shape

    spec = make_spec("x", ("x", "y"))
    assert spec_name(make_spec("x", None)) == "S0R"
    assert str(to_partition_spec(make_spec(None, ("x", "y")))) == str(
        __import__("jax").sharding.PartitionSpec(None, ("x", "y"))
    )
    assert shard_shape((8, 12), make_spec("x", "y"), (2, 3)) == (4, 4)
    with pytest.raises(ValueError, match="not divisible by the 3 devices"):
        check_spec((8, 10), make_spec(None, "y"), (2, 3))
    with pytest.raises(ValueError, match="used twice"):
        check_spec((8, 12), spec, (2, 2))
