"""Every suggestion rule fires when its number crosses the threshold and stays silent below it;
on real traces, the DataLoader rule fires on ResNet-50 with num_workers=0 and not with 4."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import real_traces
from tracelens.analysis import GpuTime, IdleSplit, analyze
from tracelens.load import load
from tracelens.suggest import RULES, suggest
from tracelens.waterfall import Bar, Waterfall

T = 1_000_000


def rank(**over):
    """A healthy rank: 95% compute, 5% idle split evenly; nothing over any threshold."""
    base = dict(
        rank=0,
        gpu=GpuTime(window=T, idle=50_000, compute=950_000, exposed_comm=0, exposed_memcpy=0, comm=0, memcpy=0),
        idle=IdleSplit(data_loading=0, host_launch=20_000, sync=0, launch_latency=30_000, pipeline_bubble=0, other=0),
        waterfall=Waterfall(T, (Bar("non_matmul", "", 100_000, 0.1), Bar("matmul_below_peak", "", 100_000, 0.1), Bar("mfu", "", 0, 0.5))),
        facts={"steps": 2, "kernels": 100, "kernels_under_10us": 10, "pageable_memcpy_ns": 0, "fp32_matmul_flops_share": 0.0,
               "has_tensor_cores": True, "optimizer_kernel_ns": 0, "item_calls": 0},
    )
    base.update(over)
    return SimpleNamespace(**base)


def idle(key, v):
    i = IdleSplit(**{key: int(v * T)})
    return {"idle": i, "gpu": GpuTime(T, int(v * T), T - int(v * T), 0, 0, 0, 0)}


def bar(key, v):
    bars = (Bar(key, "", int(v * T), v), Bar("mfu", "", 0, 0.1))
    return {"waterfall": Waterfall(T, bars)}


def fact(**kw):
    f = dict(rank().facts)
    f.update(kw)
    return {"facts": f}


SCENARIOS = {
    "input_bound_high": lambda x: idle("data_loading", x),
    "input_bound_moderate": lambda x: idle("data_loading", x),
    "host_launch_bound": lambda x: idle("host_launch", x),
    "sync_drain": lambda x: idle("sync", x),
    "launch_latency": lambda x: idle("launch_latency", x),
    "pipeline_bubble": lambda x: idle("pipeline_bubble", x),
    "low_gpu_utilization": lambda x: idle("other", x),
    "exposed_communication": lambda x: {"gpu": GpuTime(T, 0, T - int(x * T), int(x * T), 0, int(x * T), 0)},
    "exposed_memcpy": lambda x: {"gpu": GpuTime(T, 0, T - int(x * T), 0, int(x * T), 0, int(x * T))},
    "non_matmul_heavy": lambda x: bar("non_matmul", x),
    "matmul_below_peak": lambda x: bar("matmul_below_peak", x),
    "recompute_heavy": lambda x: bar("recompute", x),
    "pageable_memcpy": lambda x: fact(pageable_memcpy_ns=int(x * T)),
    "fp32_matmul": lambda x: fact(fp32_matmul_flops_share=x),
    "optimizer_kernels": lambda x: fact(optimizer_kernel_ns=int(x * T)),
    "many_tiny_kernels": lambda x: fact(kernels=100, kernels_under_10us=int(x * 100)),
    "item_in_step": lambda x: fact(steps=2, item_calls=int(x * 2)),
}


def fired(r) -> set[str]:
    return {s.id for s in suggest(SimpleNamespace(ranks=[r], stragglers=()))}


def test_every_rule_has_a_scenario_and_there_are_enough_rules():
    assert {r.id for r in RULES} == set(SCENARIOS)
    assert len(RULES) + 1 >= 15  # and the straggler rule


def test_a_healthy_rank_gets_no_advice():
    assert fired(rank()) == set()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_fires_above_and_not_below(rule):
    hi = 0.21 if rule.id == "input_bound_high" else min(rule.threshold * 1.5, 0.19 if rule.id == "input_bound_moderate" else 1e9)
    lo = rule.threshold * 0.5
    above = fired(rank(**SCENARIOS[rule.id](hi)))
    below = fired(rank(**SCENARIOS[rule.id](lo)))
    assert rule.id in above and rule.id not in below


def test_fp32_rule_needs_tensor_cores():
    assert "fp32_matmul" not in fired(rank(**fact(fp32_matmul_flops_share=1.0, has_tensor_cores=False)))


def test_dataloader_rule_on_the_resnet_pair():
    base = real_traces() / "kineto-tbplugin/samples"
    slow = analyze(load([base / "resnet50_num_workers_0"], use_cache=False)).to_dict()["suggestions"]
    fast = analyze(load([base / "resnet50_num_workers_4"], use_cache=False)).to_dict()["suggestions"]
    assert "input_bound_high" in {s["id"] for s in slow}
    top = slow[0]
    assert top["id"] == "input_bound_high" and 1.3 < top["est_speedup"] < 1.5  # 27.6% of the step: up to 1/(1-0.276)
    assert not {"input_bound_high", "input_bound_moderate"} & {s["id"] for s in fast}
    # ResNet-50 in FP32 on a V100 (FP16 tensor cores): the precision rule fires on both
    assert "fp32_matmul" in {s["id"] for s in slow} and "fp32_matmul" in {s["id"] for s in fast}
