"""Bad input, one table per category: every case ends in a clear error of the right type, naming the problem.

After each case the user's params are checked unchanged.  Nothing here may
hang, read a file the input names, or end in a raw traceback from deep inside.
"""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpaviz as av
from alpaviz.core import MAX_DOCUMENT_BYTES, PlanFormatError, Schedule, StepStructureError
from alpaviz.core.runtime._compile import HostCallbackWarning


@pytest.fixture(scope="module")
def model():
    step, params, batch = av.models.gpt(num_layers=2, hidden=32, heads=2, seq_len=16, vocab=64, batch_size=8)
    graph = av.trace(step, params, batch)
    plan = av.manual_plan(graph, av.Cluster.local(), stage_cuts=(1,), schedule=Schedule("1f1b", 2))
    snapshot = jax.tree.map(np.array, params)
    yield dict(step=step, params=params, batch=batch, graph=graph, plan=plan, doc=json.loads(plan.to_json()))
    # The user's params are never touched, whatever failed.
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(snapshot)):
        np.testing.assert_array_equal(np.asarray(a), b)


def _raises(model, case):
    _, action, error, words = case
    with pytest.raises(error, match=words):
        action(model)


def _solve(m, **options):
    options.setdefault("cluster", av.Cluster.local())
    return av.solve(m["graph"], progress=False, **options)


def _edited(m, edit) -> str:
    doc = json.loads(json.dumps(m["doc"]))
    edit(doc)
    return json.dumps(doc)


def _set(path, value):
    def edit(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


# ---- mesh and microbatches ---------------------------------------------------------------------

MESH_AND_MICROBATCHES = [
    ("microbatches_bool", lambda m: _solve(m, num_microbatches=True), TypeError, "num_microbatches must be an int"),
    ("microbatches_zero", lambda m: _solve(m, num_microbatches=0), ValueError, "num_microbatches must be >= 1"),
    ("microbatches_float", lambda m: _solve(m, num_microbatches=2.5), TypeError, "must be an int, got float"),
    ("schedule_typo", lambda m: _solve(m, schedule="gpippe"), ValueError, r"schedule kind must be one of.*gpippe"),
    ("schedule_object_typo", lambda m: Schedule("gpippe", 2), ValueError, "schedule kind must be one of"),
    ("microbatches_huge", lambda m: Schedule("1f1b", 10**12), ValueError, "must be <= 65536"),
    ("cluster_no_hosts", lambda m: av.Cluster(0, 8, av.Cluster.local().device, av.Cluster.local().intra_host,
                                              av.Cluster.local().inter_host), ValueError, "at least one host"),
    ("cluster_bool_hosts", lambda m: dataclasses.replace(av.Cluster.local(), num_hosts=True), TypeError,
     "Cluster.num_hosts must be an int"),
    ("cut_not_int", lambda m: av.manual_plan(m["graph"], av.Cluster.local(), stage_cuts=(1.5,)), TypeError,
     "a stage cut must be an int"),
    ("cut_past_the_layers", lambda m: av.manual_plan(m["graph"], av.Cluster.local(), stage_cuts=(9,)), ValueError,
     "must increase strictly inside"),
    ("mesh_does_not_divide", lambda m: av.manual_plan(
        m["graph"], av.Cluster.local(), devices_per_stage=6, logical_meshes=(6, 1),
        partition_specs={"batch.tokens": av.make_spec("x", None)}), ValueError, "size 8 is not divisible by the 6"),
    ("submeshes_cannot_tile", lambda m: _solve(m, submeshes=[(1, 3)]), ValueError, "cannot tile the cluster's 8"),
    ("submesh_too_big", lambda m: _solve(m, submeshes=[(1, 16)]), ValueError, "does not fit cluster"),
    ("layers_zero", lambda m: _solve(m, num_layers=0), ValueError, "num_layers must be >= 1"),
    ("workers_zero", lambda m: _solve(m, workers=0), ValueError, "workers must be >= 1"),
    ("tolerance_nan", lambda m: _solve(m, tolerance=math.nan), ValueError, "tolerance must be a finite number"),
    ("cluster_not_a_cluster", lambda m: _solve(m, cluster="local"), TypeError, "cluster must be an av.Cluster"),
]


@pytest.mark.parametrize("case", MESH_AND_MICROBATCHES, ids=[c[0] for c in MESH_AND_MICROBATCHES])
def test_mesh_and_microbatches(model, case):
    _raises(model, case)


# ---- pins -----------------------------------------------------------------------------------------

def _strategy_against_spec(m):
    """Pin a dot to split its output along the batch, and pin that output replicated."""
    graph, cluster = m["graph"], av.Cluster.local()
    mesh = cluster.logical_mesh((1, 8), (8, 1))
    dot = next(n for n in graph.nodes if n.primitive == "dot_general" and len(graph.tensor(n.outputs[0]).shape) == 3)
    split = next(s for s in av.core.strategy_names(graph, dot.name, mesh) if s.startswith("S0RR = S0RR x RR"))
    out = dot.outputs[0]
    pins = av.Pins().with_strategy(dot.name, split).with_partition_spec(out, ((), (), ()))
    _solve(m, pins=pins)


PINS = [
    ("strategy_against_spec", _strategy_against_spec, av.InfeasiblePinsError,
     r"cannot all hold together.*uses 'S0RR = S0RR x RR'.*sharded as RRR"),
    ("cut_float", lambda m: av.Pins(stage_cuts=(1.5,)), TypeError, "a pinned cut .* must be an int"),
    ("cut_zero", lambda m: av.Pins(stage_cuts=(0,)), ValueError, "a stage cut is a layer index >= 1"),
    ("cut_and_no_cut", lambda m: av.Pins(stage_cuts=(1,), forbidden_cuts=(1,)), ValueError,
     "both as a cut and as no-cut"),
    ("stages_bool", lambda m: av.Pins(num_stages=True), TypeError, "num_stages must be an int"),
    ("mesh_float", lambda m: av.Pins().with_submesh(0, (1, 2.0)), TypeError, "mesh shape must be an int"),
    ("unknown_operator", lambda m: _solve(m, pins=av.Pins().with_strategy("n999_dot", "RR = RR")),
     av.InfeasiblePinsError, "there is no operator 'n999_dot' in the graph; remove the pin"),
    ("cut_beyond_layers", lambda m: _solve(m, pins=av.Pins(stage_cuts=(5,))), av.InfeasiblePinsError,
     r"cut before layer 5: the graph has layers 0\.\.\d, so a cut is 1\.\.\d"),
    ("more_stages_than_devices", lambda m: _solve(m, pins=av.Pins(num_stages=9)), av.InfeasiblePinsError,
     r"9 stages: at most \d \(one layer and one device per stage"),
    ("remat_stage_beyond_stages", lambda m: _solve(m, pins=av.Pins().with_remat(99, True)), av.InfeasiblePinsError,
     r"stage 99 is pinned but there can be at most \d stages"),
    ("remat_not_bool", lambda m: av.Pins(stage_remat={0: "yes"}), ValueError, "a remat pin is \\(stage, True or False\\)"),
    ("pins_not_pins", lambda m: _solve(m, pins={"stage_cuts": (1,)}), TypeError, "pins must be an av.Pins"),
]


@pytest.mark.parametrize("case", PINS, ids=[c[0] for c in PINS])
def test_pins(model, case):
    _raises(model, case)


# ---- memory -----------------------------------------------------------------------------------------

MEMORY = [
    ("limit_nan", lambda m: _solve(m, memory_limit=math.nan), ValueError, "memory_limit .* must be a finite number"),
    ("limit_negative", lambda m: _solve(m, memory_limit=-1.0), ValueError, "must be positive"),
    ("device_memory_nan", lambda m: av.DeviceSpec("x", 1e12, math.nan), ValueError,
     "DeviceSpec.memory_bytes must be a finite number"),
    ("link_bandwidth_nan", lambda m: av.Link(1e-6, math.nan), ValueError, "bandwidth_bytes_per_s must be a finite"),
    ("cost_model_nan", lambda m: av.CostModel(compute_efficiency=math.nan), ValueError, "must be a finite number"),
    ("does_not_fit", lambda m: _solve(m, memory_limit=1024.0), av.ModelTooLargeError,
     r"the best plan needs .* per device .* but the limit is 1.00 KiB per device"),
]


@pytest.mark.parametrize("case", MEMORY, ids=[c[0] for c in MEMORY])
def test_memory(model, case):
    _raises(model, case)


# ---- plan files -------------------------------------------------------------------------------------

PLAN_FILES = [
    ("deep_nesting", lambda m: av.Plan.from_json("[" * 200_000), PlanFormatError, "nested 200000 levels"),
    ("huge_integer", lambda m: av.Plan.from_json(_edited(m, lambda d: d.update(schema_version=0)).replace(
        '"schema_version": 0', '"schema_version": ' + "9" * 6000)), PlanFormatError, "unreadable number"),
    ("nan_figure", lambda m: av.Plan.from_json(_edited(m, _set(["predicted", "step_time_s"], 1.0)).replace(
        '"step_time_s": 1.0', '"step_time_s": NaN')), PlanFormatError, "NaN is not a valid number"),
    ("no_stages", lambda m: av.Plan.from_json(_edited(m, _set(["stages"], []))), PlanFormatError,
     "at least one stage"),
    ("microbatches_huge", lambda m: av.Plan.from_json(_edited(m, _set(["schedule", "num_microbatches"], 10**12))),
     PlanFormatError, r"plan.schedule: num_microbatches must be <= 65536"),
    ("schedule_typo", lambda m: av.Plan.from_json(_edited(m, _set(["schedule", "kind"], "gpippe"))),
     PlanFormatError, "plan.schedule.kind"),
    ("repeated_device", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 0, "device_ids"], [0, 0, 1, 2]))),
     PlanFormatError, "repeat a device"),
    ("overlapping_stages", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 1, "device_ids"], [0, 1, 2, 3]))),
     PlanFormatError, "device 0 is in stage 0 and stage 1"),
    ("negative_device", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 0, "device_ids"], [-1, 1, 2, 3]))),
     PlanFormatError, "device id must be >= 0"),
    ("device_out_of_range", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 1, "device_ids"], [4, 5, 6, 70]))),
     PlanFormatError, "uses device 70, but cluster .* has 8 devices"),
    ("submesh_mismatch", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 0, "submesh"], [1, 2]))),
     PlanFormatError, r"submesh \(1, 2\) does not match 4 device ids"),
    ("ids_straddle_hosts", lambda m: av.Plan.from_json(_edited(m, lambda d: (
        _set(["cluster", "num_hosts"], 2)(d), _set(["cluster", "devices_per_host"], 4)(d),
        _set(["stages", 0, "device_ids"], [2, 3, 4, 5])(d), _set(["stages", 1, "device_ids"], [0, 1, 6, 7])(d)))),
     PlanFormatError, r"spans 1 host\(s\) but its device ids \[2, 3, 4, 5\] sit on hosts \[0, 1\]"),
    ("layer_renumbered", lambda m: av.Plan.from_json(_edited(m, _set(["layers", 1, "index"], 7))),
     PlanFormatError, "layer 1 is numbered 7"),
    ("cut_not_int", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 0, "layer_stop"], 1.5))),
     PlanFormatError, "expected an integer, got 1.5"),
    ("unknown_operator", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 0, "strategies"], [["n999_x", "RR"]])))
     .check_graph(m["graph"]), PlanFormatError, "no operator named 'n999_x'"),
    ("bogus_strategy", lambda m: av.core.check_plan_strategies(av.Plan.from_json(_edited(
        m, _set(["stages", 0, "strategies"], [[m["graph"].nodes[0].name, "SS = bogus"]]))), m["graph"]),
     PlanFormatError, "'SS = bogus' is not a strategy of"),
    ("unknown_tensor", lambda m: av.Plan.from_json(_edited(m, _set(["stages", 0, "partition_specs"],
                                                                   [["params.nope", [["x"]]]]))).check_graph(m["graph"]),
     PlanFormatError, "no tensor named 'params.nope'"),
    ("over_the_size_limit", lambda m: av.Plan.from_json(" " * (MAX_DOCUMENT_BYTES + 1)), PlanFormatError,
     "over the"),
    ("not_json", lambda m: av.Plan.from_json("/etc/passwd"), PlanFormatError, "not valid JSON"),
    ("other_graph", lambda m: av.Plan.from_json(_edited(m, _set(["graph_fingerprint"], "0" * 16)))
     .check_graph(m["graph"]), PlanFormatError, "different operator graph"),
]


@pytest.mark.parametrize("case", PLAN_FILES, ids=[c[0] for c in PLAN_FILES])
def test_plan_files(model, case):
    _raises(model, case)


def test_plan_files_are_refused_in_bounded_time(model):
    """A 60 MB document of brackets and one of 100k stages are refused within seconds, not parsed whole."""
    import time

    many = _edited(model, _set(["stages"], [model["doc"]["stages"][0]] * 100_000))
    for text, words in (("[" * 60_000_000, "nested 60000000 levels"), (many, "100000 stages for 2 layers")):
        start = time.perf_counter()
        with pytest.raises(PlanFormatError, match=words):
            av.Plan.from_json(text)
        assert time.perf_counter() - start < 30


# ---- runtime calls ------------------------------------------------------------------------------------


def _call_with_batch(m, batch):
    step = av.parallelize(m["step"], m["plan"])
    step(m["params"], m["batch"])
    step(m["params"], batch)


def _first_call_other_dtype(m):
    narrow = {**m["batch"], "labels": m["batch"]["labels"].astype(jnp.int16)}
    av.parallelize(m["step"], m["plan"])(m["params"], narrow)


RUNTIME = [
    ("plan_not_a_plan", lambda m: av.parallelize(m["step"], "plan.json"), TypeError, "plan must be an av.Plan"),
    ("step_not_callable", lambda m: av.parallelize(None, m["plan"]), TypeError, "train_step must be the step"),
    ("engine_typo", lambda m: av.parallelize(m["step"], m["plan"], engine="gpu"), ValueError,
     "engine must be 'local' or 'ray'"),
    ("loss_reduction_typo", lambda m: av.parallelize(m["step"], m["plan"], loss_reduction="avg"), ValueError,
     "loss_reduction must be"),
    ("batch_argnums_bool", lambda m: av.parallelize(m["step"], m["plan"], batch_argnums=(True,)), TypeError,
     "batch_argnums entry must be an int"),
    ("smaller_batch_later", lambda m: _call_with_batch(m, jax.tree.map(lambda x: x[:4], m["batch"])), ValueError,
     r"argument 'batch.labels' is int32\[4, 16\].*int32\[8, 16\].*2 microbatches of 4"),
    ("first_call_other_dtype", _first_call_other_dtype, ValueError, r"different operator graph.*batch\.labels: int16"),
    ("record_trace_zero", lambda m: av.parallelize(m["step"], m["plan"], record_trace=0), ValueError,
     "record_trace must be False, True or a step interval N >= 1"),
]


@pytest.mark.parametrize("case", RUNTIME, ids=[c[0] for c in RUNTIME])
def test_runtime_calls(model, case):
    _raises(model, case)


def test_a_host_callback_in_a_sharded_stage_is_announced_before_launch():
    params, x = jnp.ones((4, 4)), jnp.ones((8, 4))

    def train_step(params, x):
        x = jax.pure_callback(lambda v: np.asarray(v), jax.ShapeDtypeStruct(x.shape, x.dtype), x)  # e.g. logging
        loss, grad = jax.value_and_grad(lambda p: jnp.mean((x @ p) ** 2))(params)
        return params - 0.1 * grad, loss

    plan = av.manual_plan(av.trace(train_step, params, x), av.Cluster.local(), schedule=Schedule("1f1b", 2))
    with pytest.warns(HostCallbackWarning, match="XLA aborts the whole process"):
        av.parallelize(train_step, plan, example_args=(params, x))


# ---- tracing --------------------------------------------------------------------------------------------


def _update_reads_the_loss(m):
    def train_step(params, x):
        loss, grad = jax.value_and_grad(lambda p: jnp.mean((x @ p) ** 2))(params)
        return params - loss * grad, loss

    av.trace(train_step, jnp.ones((4, 4)), jnp.ones((8, 4)))


TRACING = [
    ("update_reads_the_loss", _update_reads_the_loss, StepStructureError, r"runs once per step.*test_bad_inputs\.py"),
    ("batch_argnums_out_of_range", lambda m: av.trace(m["step"], m["params"], m["batch"], batch_argnums=(5,)),
     ValueError, "names argument 5, but the step takes 2"),
    ("model_zoo_setting_typo", lambda m: av.models.gpt(num_layers=2, batch=8), TypeError,
     r"GPT has no setting batch; its settings are \[.*'hidden'.*batch_size"),
    ("solve_given_a_graph_and_args", lambda m: av.solve(m["graph"], m["params"], cluster=av.Cluster.local()),
     ValueError, "takes no example arguments"),
]


@pytest.mark.parametrize("case", TRACING, ids=[c[0] for c in TRACING])
def test_tracing(model, case):
    _raises(model, case)


def test_typed_keys_trace_instead_of_raising():
    def train_step(w, x, key):
        noise = jax.random.normal(key, x.shape)
        return w - 0.1 * jax.grad(lambda w: jnp.mean((x + noise) @ w))(w), key

    graph = av.trace(train_step, jnp.ones((4, 4)), jnp.ones((8, 4)), jax.random.key(0))
    assert graph.tensor(graph.inputs[2]).dtype == "key<fry>" and graph.tensor(graph.inputs[2]).nbytes == 8


# ---- the app's load and save ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session(model):
    from alpaviz.widgets import EditorSession

    return EditorSession(model["graph"], model["plan"], solver=lambda *a, **k: model["plan"])


APP = [
    ("a_path_is_not_opened", b"/etc/hostname", "not valid JSON"),
    ("a_fifo_path_is_not_opened", b"/dev/stdin", "not valid JSON"),
    ("deep_document", b"{" * 100_000, "nested 100000 levels"),
    ("over_the_size_limit", b" " * (MAX_DOCUMENT_BYTES + 1), "over the"),
    ("not_utf8", b"\xff\xfe{}", "not UTF-8"),
    ("another_graphs_plan", None, "different operator graph"),
]


@pytest.mark.parametrize("case", APP, ids=[c[0] for c in APP])
def test_the_apps_load_takes_bytes_only(model, session, case):
    _, document, words = case
    if document is None:
        document = _edited(model, _set(["graph_fingerprint"], "f" * 16)).encode()
    shown = session.plan
    outcome = session.load_text(document)
    assert not outcome.ok and words in outcome.message and session.plan is shown
    assert "root" not in outcome.message  # nothing of a server file leaks into the message


def test_the_panel_upload_never_reads_a_server_path(model, session, tmp_path):
    from alpaviz.widgets._app import PanelEditor

    secret = tmp_path / "secret.json"
    secret.write_text(model["plan"].to_json())  # a valid plan: loading it by path would succeed
    editor = PanelEditor(session)
    editor.upload.value = str(secret).encode()
    assert not session.ok and "not valid JSON" in session.message
    editor.upload.value = model["plan"].to_json().encode()  # the bytes themselves do load
    assert session.ok, session.message
