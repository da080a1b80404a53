"""The what-if replay on the critical-path graph (tracelens.analysis.rank.replay): the identity
replay reproduces every step, hand-built traces pin what a change buys to the ns, and pairs of
real runs (a fix applied in the second) hold the prediction to what the second run measured."""

from __future__ import annotations

import gzip
import json
import time
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import real_trace_files, real_traces
from tests.test_critical import ON, K, L, X, write
from tracelens.analysis import Options, analyze
from tracelens.analysis.rank import critical, replay
from tracelens.model.summary import kept_indices
from tracelens.store.job import load

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "tracelens/model/report.schema.json").read_text())


def _replays(monkeypatch, paths, changes):
    """Analyse ``paths`` (one job, or a loaded job) with the critical path, replaying ``changes`` (strings) too:
    (analysis, {rank: {change: [ns per step]}}); "" is the identity replay."""
    got: dict[int, dict[str, list[int]]] = {}
    real = critical.step_paths

    def spy(df, device, windows, main_tid, names, g, **kw):  # the rank's graph, as the analysis built it
        r = replay.Replay(df, g, windows, main_tid)
        got[len(got)] = {c: r.run(replay.parse(c) if c else None)[0] for c in changes}
        return real(df, device, windows, main_tid, names, g=g, **kw)

    monkeypatch.setattr(critical, "step_paths", spy)
    a = analyze(paths if hasattr(paths, "handles") else load(paths, use_cache=False), ON)
    return a, got


def _kept_mean(rank, per_step=None) -> float:
    kept = kept_indices(list(rank.steps))
    vals = [per_step[i] if per_step is not None else rank.steps[i].dur_ns for i in kept]
    return sum(vals) / len(vals)


# -- identity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", ["hta", "kineto-tbplugin", "amd-tracelens"])
def test_identity_replay_reproduces_every_step(folder, monkeypatch):
    # With no change, every node's waited-for edge keeps its observed gap and every other edge no
    # more, so each node lands on its observed time: each step's predicted time is its measured
    # time exactly (no shared trace differs, so the test asks for equality, not the 1%).
    seen = 0
    for p in real_trace_files(folder):
        try:
            job = load([p], use_cache=False)
        except Exception:  # unreadable on purpose (bad-input samples): the parser's tests cover them
            continue
        a, got = _replays(monkeypatch, job, [""])
        for i, r in enumerate(a.ranks):
            if r.gpu is None or i not in got:
                continue
            seen += 1
            assert got[i][""] == [s.dur_ns for s in r.steps], p
    assert seen


# -- hand-built traces ------------------------------------------------------------------------

def _one_rank(monkeypatch, tmp_path, events, changes):
    a, got = _replays(monkeypatch, [write(tmp_path, events)], changes)
    (r,) = a.ranks
    return r, got[0]


def test_gpu_bound_step_gains_exactly_the_faster_kernels_time(tmp_path, monkeypatch):
    # The host launches k1 (gemm) and k2 (elementwise) early (calls [1, 3], [4, 6]) and blocks in
    # cudaDeviceSynchronize [7, 100].  k1 [10, 50], k2 [52, 98] on one stream.  Window [10, 100]: 90 µs.
    # kclass[gemm]/2: k1 takes 20 µs, [10, 30] (its start was set by its launch: 1 + 9 µs latency,
    # kept); k2 waited for k1, not for its launch (at 4): it starts 2 µs (the gap it had) after k1,
    # [32, 78]; the sync waited for k2 and returns 2 µs after it: 80.  90 - 20 = 70 µs.
    # kclass[elementwise]/2: k2 [52, 75], sync 77: 67 µs.  Both: k1 [10, 30], k2 [32, 55], 57: 47 µs.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        L(1, 2, 1), L(4, 2, 2), X("cuda_runtime", "cudaDeviceSynchronize", 7, 93),
        K("sm90_xmma_gemm_a", 10, 40, corr=1), K("vectorized_elementwise_kernel", 52, 46, corr=2),
    ]
    r, got = _one_rank(monkeypatch, tmp_path, ev, ["", "kclass[gemm]/2", "kclass[elementwise]/2",
                                                   "kclass[gemm]/2+kclass[elementwise]/2", "kernel[xmma]=0"])
    assert r.steps[0].dur_ns == 90_000
    assert got[""] == [90_000]
    assert got["kclass[gemm]/2"] == [70_000]
    assert got["kclass[elementwise]/2"] == [67_000]
    assert got["kclass[gemm]/2+kclass[elementwise]/2"] == [47_000]
    # k1 removed: it ends where it starts (10); k2 starts at the later of k1's end + its 2 µs gap (12)
    # and its launch + the typical launch latency (4 + 9, k1's: the rank's median of the latencies
    # kernels waited for): 13, [13, 59]; the sync 2 µs after: 61.  51 µs.
    assert got["kernel[xmma]=0"] == [51_000]


def test_cpu_bound_step_gains_nothing_from_a_faster_kernel(tmp_path, monkeypatch):
    # ProfilerStep [0, 100] µs.  Op A [0, 40] launches k1 (call [30, 35]); op B [40, 100] launches
    # k2 (call [90, 95]).  k1 [38, 40], k2 [97, 99]: the GPU waits for the host.  Window [38, 100].
    # Both kernels 2x faster: k1 [38, 39], k2 [97, 98]; the step still ends with B at 100: 62 µs.
    # host/2 (every host interval half as long), replayed from the window's start (38; what came
    # before stays as it was): A's tail after its call (35) 2.5: 37.5; B's self time to its call
    # 25: 62.5; the call 2.5: 65; B's tail 2.5: 67.5.  k1 still starts at 38 (its launch at 30 + 8).
    # The step: from k1's start (38) to B's end (67.5): 29.5 µs.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("cpu_op", "aten::A", 0, 40), L(30, 5, 1), K("sm90_xmma_gemm_a", 38, 2, corr=1),
        X("cpu_op", "aten::B", 40, 60), L(90, 5, 2), K("sm90_xmma_gemm_b", 97, 2, corr=2),
    ]
    r, got = _one_rank(monkeypatch, tmp_path, ev, ["", "kclass[gemm]/2", "host/2"])
    assert r.steps[0].dur_ns == 62_000
    assert got[""] == [62_000]
    assert got["kclass[gemm]/2"] == [62_000]
    assert got["host/2"] == [29_500]


def test_sync_waits_shrink_with_the_gpu(tmp_path, monkeypatch):
    # Op A [0, 64] launches k1 [12, 62] (call [2, 4]) and blocks in cudaDeviceSynchronize [5, 64];
    # op B [64, 70] launches k2 [72, 80] (call [65, 67]).  Step [0, 80], window [12, 80]: 68 µs.
    # kclass[gemm]/2: k1 [12, 37]; the sync returns its 2 µs lag after k1: 39 (A's end too); B's
    # 1 µs to its call: 40; k2 7 µs after its call's start (its latency; it waited for the launch,
    # not for k1): [47, 55].  The step ends at k2's end: 68 - 25 = 43 µs.
    # kclass[elementwise]/2: k2 [72, 76]: 68 - 4 = 64 µs.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 80),
        X("cpu_op", "aten::A", 0, 64), L(2, 2, 1), X("cuda_runtime", "cudaDeviceSynchronize", 5, 59),
        K("sm90_xmma_gemm_a", 12, 50, corr=1),
        X("cpu_op", "aten::B", 64, 6), L(65, 2, 2), K("vectorized_elementwise_kernel", 72, 8, corr=2),
    ]
    r, got = _one_rank(monkeypatch, tmp_path, ev, ["", "kclass[gemm]/2", "kclass[elementwise]/2"])
    assert got[""] == [r.steps[0].dur_ns] == [68_000]
    assert got["kclass[gemm]/2"] == [68_000 - 25_000]
    assert got["kclass[elementwise]/2"] == [68_000 - 4_000]  # k2 is the step's last node: its 4 µs saved


def test_exposed_communication_overlapped_or_faster(tmp_path, monkeypatch):
    # As the GPU-bound step, k2 an all-reduce: k1 gemm [10, 50], the all-reduce [52, 92] (calls
    # [1, 3], [4, 6]); cudaDeviceSynchronize [7, 100], returning 8 µs after the all-reduce.
    # Window [10, 100]: 90 µs.  comm=0: the all-reduce takes no time, [52, 52]; the sync 60: 50 µs.
    # comm[AllReduce]/2: [52, 72], the sync 80: 70 µs.  comm[AllGather]/2: nothing matches: 90 µs.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        L(1, 2, 1), L(4, 2, 2), X("cuda_runtime", "cudaDeviceSynchronize", 7, 93),
        K("sm90_xmma_gemm_a", 10, 40, corr=1), K("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 52, 40, corr=2),
    ]
    _r, got = _one_rank(monkeypatch, tmp_path, ev, ["", "comm=0", "comm[AllReduce]/2", "comm[AllGather]/2"])
    assert got == {"": [90_000], "comm=0": [50_000], "comm[AllReduce]/2": [70_000], "comm[AllGather]/2": [90_000]}


def test_launch_gaps_closed(tmp_path, monkeypatch):
    # The sync-bound step (below): window [12, 80], 68 µs.  launch=0 (CUDA graphs): k1 starts at its
    # launch call's start (2, before the window: as observed), [2, 52] (the window's first node 10 µs
    # earlier); the sync 54, A's end 54; B's 1 µs: its call at 55, taking no time; k2 at 55, [55, 63].
    # From k1's start (2) to k2's end (63): 61 µs, k2's 7 µs launch latency saved.
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 80),
        X("cpu_op", "aten::A", 0, 64), L(2, 2, 1), X("cuda_runtime", "cudaDeviceSynchronize", 5, 59),
        K("sm90_xmma_gemm_a", 12, 50, corr=1),
        X("cpu_op", "aten::B", 64, 6), L(65, 2, 2), K("vectorized_elementwise_kernel", 72, 8, corr=2),
    ]
    _r, got = _one_rank(monkeypatch, tmp_path, ev, ["launch=0"])
    assert got["launch=0"] == [61_000]


def test_bad_changes_are_refused():
    for bad in ("", "data_loading=1", "comm/0", "kclass=0", "kernel/2", "host=0", "warp/2", "launch/3"):
        with pytest.raises(ValueError):
            replay.parse(bad)
    assert str(replay.Change.parse("kclass[gemm, conv]/2")) == "kclass[gemm,conv]/2"
    assert [str(c) for c in replay.parse("data_loading=0+host/0.8")] == ["data_loading=0", "host/0.8"]


# -- real pairs ---------------------------------------------------------------------------------

def _raw_op_time(path: Path) -> dict[str, tuple[int, float]]:
    """Plain Python over the raw file: per CPU op name, (count, total µs); not the step spans nor the DataLoader's."""
    with gzip.open(path) if path.name.endswith(".gz") else open(path, "rb") as f:
        events = json.load(f)["traceEvents"]
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator") and not name.startswith("ProfilerStep#") and "DataLoader" not in name:
            out[e["name"]][0] += 1
            out[e["name"]][1] += float(e.get("dur", 0))
    return {k: (n, d) for k, (n, d) in out.items()}


def test_resnet50_num_workers_pair(monkeypatch):
    # Run num_workers_0 with its data loading removed must predict num_workers_4's step time.
    (w0,) = real_trace_files("kineto-tbplugin/samples/resnet50_num_workers_0")
    (w4,) = real_trace_files("kineto-tbplugin/samples/resnet50_num_workers_4")
    # the host ops that both runs run the same number of times take 21.7% longer in num_workers_4:
    # its 4 worker processes share the CPU with the training loop (plain Python over both files)
    a_ops, b_ops = _raw_op_time(w0), _raw_op_time(w4)
    same = [k for k in a_ops if k in b_ops and a_ops[k][0] == b_ops[k][0]]
    slow = sum(b_ops[k][1] for k in same) / sum(a_ops[k][1] for k in same)
    assert 1.15 < slow < 1.3
    change = f"data_loading=0+host/{1 / slow:.4f}"
    a, got = _replays(monkeypatch, [w0], ["data_loading=0", change])
    b = analyze(load([w4], use_cache=False), Options())
    (ra,), (rb,) = a.ranks, b.ranks
    assert round(_kept_mean(ra) / 1e6, 2) == 164.05  # ms, the kept steps' mean as tracelens reports them
    assert round(_kept_mean(rb) / 1e6, 2) == 132.38
    pure = _kept_mean(ra, got[0]["data_loading=0"])
    with_contention = _kept_mean(ra, got[0][change])
    target = _kept_mean(rb)
    # the data loading alone (70 ms of the path per step) predicts 118.5 ms: 10.5% under, the
    # contention the replay cannot see from run 0; with the host slowed by the measured factor,
    # within 5%
    assert abs(with_contention - target) <= 0.05 * target, (with_contention, target)
    assert 0.85 * target < pure < 0.95 * target, (pure, target)
    # the report: the input-bound suggestion carries the replayed prediction next to its bound
    d = a.to_dict()
    jsonschema.validate(d, SCHEMA)
    (sg,) = [s for s in d["suggestions"] if s["id"] == "input_bound_high"]
    wi = sg["what_if"]
    assert wi["change"] == "data_loading=0"
    assert wi["predicted_step_ns"] == round(pure)
    assert wi["predicted_speedup"] == round(_kept_mean(ra) / pure, 3)
    assert wi["predicted_mfu"] is None or wi["predicted_mfu"] == pytest.approx(ra.mfu * _kept_mean(ra) / pure, abs=1e-4)
    assert sg["est_speedup"] is not None  # the upper bound stays, next to the replay


@pytest.mark.xfail(strict=True, reason="the replay of data loading removed does not see the CPU contention of the "
                   "4 worker processes (host ops 21.7% slower in num_workers_4): 118.5 ms predicted, 132.4 measured")
def test_resnet50_pair_without_the_contention_within_5_percent(monkeypatch):
    (w0,) = real_trace_files("kineto-tbplugin/samples/resnet50_num_workers_0")
    a, got = _replays(monkeypatch, [w0], ["data_loading=0"])
    assert abs(_kept_mean(a.ranks[0], got[0]["data_loading=0"]) - 132.377e6) <= 0.05 * 132.377e6


def _record_dataloader_run(out: Path, delay_s: float, steps: int = 9) -> Path:
    """A CPU training loop with a DataLoader (num_workers=0) whose __getitem__ sleeps ``delay_s``,
    recorded with torch's profiler (ProfilerStep spans)."""
    torch = pytest.importorskip("torch")

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            if delay_s:
                time.sleep(delay_s)
            return torch.full((64,), float(i % 7)), torch.tensor(i % 4)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=0))
    x, y = next(loader)  # warm the kernels
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with torch.profiler.record_function(f"ProfilerStep#{i}"):  # the step spans torch's schedule would write
                x, y = next(loader)
                # the step's own work: a fixed 100 ms of host time (a sleep: the shared test machine's
                # load cannot stretch it as it stretches ops, by 2x from one step to the next) and a few small ops
                time.sleep(0.1)
                for _ in range(2):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    prof.export_chrome_trace(str(out))
    return out


def _dataloader_pair(tmp_path, monkeypatch, attempt: int) -> tuple[float, float, float]:
    """(the slow run's fastest kept step, its fastest predicted with data loading removed, the fast
    run's fastest kept step), ns."""
    slow = _record_dataloader_run(tmp_path / f"slow{attempt}.json", 0.01)
    fast = _record_dataloader_run(tmp_path / f"fast{attempt}.json", 0.0)
    a, got = _replays(monkeypatch, [slow], ["", "data_loading=0"])
    b = analyze(load([fast], use_cache=False), Options())
    (ra,), (rb,) = a.ranks, b.ranks
    assert ra.gpu is None and len(ra.steps) >= 5
    assert got[0][""] == [s.dur_ns for s in ra.steps]
    # one thread: each step's prediction is its time less the data loading on its critical path
    # (two computations: the path's last-arriving edges, the replay's longest path)
    cps = ra.critical_path["steps"]
    assert got[0]["data_loading=0"] == [s.dur_ns - c["by_category_ns"].get("data_loading", 0) for s, c in zip(ra.steps, cps)]
    # the fastest kept step of each run, not the mean: on a shared test machine the same step's
    # ops take 50 to 240 ms from one step to the next (other processes take the CPU), in either
    # run; the fastest step is the one least disturbed
    kept_a, kept_b = kept_indices(list(ra.steps)), kept_indices(list(rb.steps))
    return (min(ra.steps[i].dur_ns for i in kept_a), min(got[0]["data_loading=0"][i] for i in kept_a),
            min(rb.steps[i].dur_ns for i in kept_b))


def test_cpu_dataloader_pair(tmp_path, monkeypatch):
    # The same loop with a 10 ms sleep per sample (4 per batch) and without: the replay of the slow
    # run with data loading removed predicts the fast run's step within 5% (host threads only).
    # The two runs are recorded one after the other on a machine other jobs share: a pair whose
    # runs were disturbed differently is recorded again (5 pairs at most); a replay that is wrong
    # misses on every pair.
    tried = []
    for attempt in range(5):
        measured_slow, pred, target = _dataloader_pair(tmp_path, monkeypatch, attempt)
        assert measured_slow - target > 20e6  # the sleep shows: 4 x 10 ms per step
        tried.append((measured_slow, pred, target))
        if abs(pred - target) <= 0.05 * target:
            break
    else:
        pytest.fail(f"no pair within 5%: (slow, predicted, fast) ns {tried}")


def test_what_if_only_with_the_critical_path(tmp_path):
    (w0,) = real_trace_files("kineto-tbplugin/samples/resnet50_num_workers_0")
    d = analyze(load([w0], use_cache=False), Options()).to_dict()
    assert d["suggestions"] and all("what_if" not in s for s in d["suggestions"])
    assert real_traces().exists()


@pytest.mark.parametrize("lift", [True, False])
def test_rounds_match_a_plain_longest_path(lift, monkeypatch):
    # Replay.run relaxes only the key rows (those a cross edge enters or leaves, the windows' ends)
    # and runs each round as one lifted running maximum (or, past LIFT_MAX_SEGMENTS, one per chain
    # segment).  Here every step window of the ResNet-50 trace is replayed node by node in the
    # graph's order, in plain Python over every candidate edge with the replay's weights: a node
    # in the window lands at the latest of T(u) + w over its in-edges (u before the window: its
    # observed time; no in-edge: its own time), and the step's prediction is its measured time
    # plus how much earlier its first node is, less how much earlier its last node is.
    if not lift:
        monkeypatch.setattr(replay, "LIFT_MAX_SEGMENTS", 0)
    (w0,) = real_trace_files("kineto-tbplugin/samples/resnet50_num_workers_0")
    seen = {}
    real = critical.step_paths

    def spy(df, device, windows, main_tid, names, g, **kw):
        seen["args"] = (df, g, windows, main_tid)
        return real(df, device, windows, main_tid, names, g=g, **kw)

    monkeypatch.setattr(critical, "step_paths", spy)
    analyze(load([w0], use_cache=False), ON)
    df, g, windows, main_tid = seen["args"]
    r = replay.Replay(df, g, windows, main_tid)
    t = g.nodes.get_column("t").to_list()
    dev, tid = g.nodes.get_column("dev").to_list(), g.nodes.get_column("tid").to_list()
    for text in ("", "memcpy=0", "kclass[gemm,conv]/2", "launch=0", "data_loading=0", "host/2"):
        changes = replay.parse(text) if text else ()
        w = r.weights(changes).to_list()
        into = defaultdict(list)
        for v, u, ei in r.e.select("v", "u", "ei").iter_rows():
            if w[ei] > replay.NEG // 2:
                into[v].append((u, w[ei]))
        want = []
        for s, e in windows:
            lo = next(o for o, x in enumerate(t) if x >= s)
            hi = max(o for o, x in enumerate(t) if x <= e) + 1
            T = {}
            for v in range(lo, hi):
                ins = [(T[u] if u >= lo else t[u]) + wt for u, wt in into[v]]
                T[v] = max(ins) if ins else t[v]
            ends = [o for o in range(lo, hi) if dev[o] or tid[o] == main_tid]
            a, z = ends[0], ends[-1]
            want.append(max((e - s) + (T[z] - t[z]) - (T[a] - t[a]), 0))
        got, rounds = r.run(changes)
        assert got == want, (text, got, want)
        assert rounds >= 1


# -- the key rows' chain order ----------------------------------------------------------------

def _chain_order_by_sort(nodes, chain, cu):
    """The definition ``replay._chain_order`` keeps without sorting: by chain (``_chain_ids``),
    then position (a node's ``2 o``; a GPU end's ``2 start + 1``, right after its start)."""
    import polars as pl

    n = nodes.height
    pos = nodes.select(pl.when(pl.col("dev") & pl.col("end")).then(cu * 2 + 1).otherwise(pl.col("o") * 2)).to_series()
    return (replay._chain_ids(nodes, chain).cast(pl.Int64) * (2 * n + 2) + pos).arg_sort(nulls_last=False).to_list()


def _graphs(monkeypatch, paths):
    seen = []
    real = critical.step_paths

    def spy(df, device, windows, main_tid, names, g, **kw):
        seen.append((df, g, windows, main_tid))
        return real(df, device, windows, main_tid, names, g=g, **kw)

    monkeypatch.setattr(critical, "step_paths", spy)
    a = analyze(load(paths, use_cache=False), ON)
    return a, seen


def _order_args(g):
    import polars as pl

    e = g.edges()
    chain = e.filter(pl.col("kind").is_in(["thread", "act", "stream"]))
    cu = pl.repeat(None, g.nodes.height, dtype=pl.Int64, eager=True).scatter(chain.get_column("v"), chain.get_column("u"))
    act = e.filter(pl.col("kind") == "act")
    return g.nodes, g.chain, act.get_column("u"), act.get_column("v"), cu


def test_chain_order_without_a_sort_is_the_sorted_one(tmp_path, monkeypatch):
    # Replay places only its key rows in the windows and reads each one's W from one running sum
    # of the chain edges' weights in chain order; that order comes from the graph's chain (threads
    # as they are, each stream's starts each followed by its end) instead of a sort of (chain,
    # position).  On the ResNet-50 trace (9 k kernels) and on a hand-built stream whose kernels
    # overlap (k2 starts before k1 ends: the graph's chain, in node order, puts k2's start before
    # k1's end; chain order keeps k1's end right after k1's start) both orders are the same list.
    (w0,) = real_trace_files("kineto-tbplugin/samples/resnet50_num_workers_0")
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), L(1, 2, 1), L(4, 2, 2), X("cuda_runtime", "cudaDeviceSynchronize", 7, 93),
          K("k1", 10, 40, corr=1), K("k2", 30, 60, corr=2)]
    for paths in ([w0], [write(tmp_path, ev)]):
        _, seen = _graphs(monkeypatch, paths)
        (df, g, windows, main_tid), = seen
        args = _order_args(g)
        got = replay._chain_order(*args).to_list()
        assert got == _chain_order_by_sort(args[0], args[1], args[4])
        assert sorted(got) == list(range(g.nodes.height))  # every node once


def test_an_activity_without_its_end_edge_takes_the_sorted_order(tmp_path, monkeypatch):
    # The order without a sort needs every activity's start -> end edge (the graph always has it:
    # an activity's start sorts before its end, and the parser clamps a negative duration to 0,
    # so k2 below lasts 0 ns).  Given one without it (k3's edge taken away here, and with it k3's
    # end's chain edge), the order has a hole and _chain_order sorts (chain, position) instead:
    # the same list as the sort, every node once; k3's end, without a chain edge, has no
    # position and sorts first.
    import polars as pl

    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), L(1, 2, 1), L(4, 2, 2), X("cuda_runtime", "cudaDeviceSynchronize", 7, 93),
          K("k1", 10, 40, corr=1), K("k2", 60, -5, corr=2), K("k3", 70, 20)]
    a, seen = _graphs(monkeypatch, [write(tmp_path, ev)])
    (df, g, windows, main_tid), = seen
    nodes, chain, au, av, cu = _order_args(g)
    k3_end = int(av[-1])
    assert g.nodes.row(k3_end, named=True)["t"] == 90_000  # k3's end: the last activity's
    au, av, cu = au.head(au.len() - 1), av.head(av.len() - 1), cu.scatter(k3_end, None)
    got = replay._chain_order(nodes, chain, au, av, cu).to_list()
    assert got == _chain_order_by_sort(nodes, chain, cu)
    assert got[0] == k3_end and sorted(got) == list(range(nodes.height))
    assert pl.Series(got).n_unique() == nodes.height
