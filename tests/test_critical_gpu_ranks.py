"""The critical path, the what-if replay and the job's what-if on generated GPU data-parallel jobs
(tests/gpusim.py: each step a DataLoader span, three kernels on stream 7, an all-reduce on stream 20
after an event wait, a cudaStreamSynchronize; the step times known from the simulation).

The default rank (gpusim.RankSpec): DataLoader 20 µs, gemm 200 µs, softmax 50 µs, gemm 200 µs, the
all-reduce's work 60 µs after its last member arrives.  A *late* rank's first gemm takes 400 µs, so
it arrives 200 µs after the others at every all-reduce and every rank's step is 743 µs:
20 (data) + 1 + 4 (first launch's latency) + 650 (kernels; 450 on a default rank) + 200 (a default
rank's wait) + 60 (the all-reduce) + 3 (sync lag) + 5 (tail) = 743 µs on the late rank's side, the
same on the others (they wait 200 µs inside their NCCL kernel)."""

from __future__ import annotations

import pytest

from tests import gpusim as G
from tracelens.analysis import Options, analyze
from tracelens.analysis.rank import critical, replay
from tracelens.store.job import load

ON = Options(critical_path=True)
LATE = [(G.GEMM, 400_000), (G.SOFTMAX, 50_000), (G.GEMM, 200_000)]


def _run(tmp_path, specs, steps=4, name="job", options=ON, **kw):
    sim = G.simulate(specs, steps)
    paths = G.write(sim, tmp_path / name, **kw)
    a = analyze(load(paths, use_cache=False, jobs=1), options)
    return sim, a, a.to_dict()


def _what_if(d, rule):
    (sg,) = [s for s in d["suggestions"] if s["id"] == rule]
    return sg


@pytest.mark.parametrize("n", [2, 4])
def test_late_rank_sets_the_job_path_and_the_others_wait(tmp_path, n):
    specs = [G.RankSpec() for _ in range(n)]
    specs[1] = G.RankSpec(kernels=LATE)
    sim, a, d = _run(tmp_path, specs)
    assert all(s == [743_000] * 4 for s in sim.step_ns)
    for r in d["ranks"]:  # every step's path is its window, its categories sum to it
        steps = r["critical_path"]["steps"]
        for k, st in enumerate(steps[:4]):
            assert st["length_ns"] == sim.step_ns[r["rank"]][k] == r["steps"][k]["dur_ns"]
            assert sum(st["by_category_ns"].values()) == st["length_ns"]
        # a default rank alone: its 200 µs wait is inside its NCCL kernel (exposed_comm 260 µs), not compute
        want = 600_000 if r["rank"] == 1 else 400_000
        assert steps[1]["by_category_ns"]["compute_gemm"] == want
    job = d["job"]["critical_path"]
    for st in job["steps"][:4]:
        # the job's path crosses to the late rank at the all-reduce: its 600 µs of gemm, only the
        # 60 µs of the all-reduce after the last arrival is exposed communication
        assert st["length_ns"] == 743_000 and sum(st["by_category_ns"].values()) == 743_000
        assert 1 in st["ranks"] and st["ns_by_rank"]["1"] > st["length_ns"] / 2
        assert st["by_category_ns"]["compute_gemm"] == 600_000 and st["by_category_ns"]["exposed_comm"] == 60_000
    kept = sum(1 for st in job["steps"][:4] if st["kept"])
    # each default rank waited 200 µs for rank 1 at every kept step's all-reduce
    assert job["wait_rank_ns"] == {str(r): {"1": 200_000 * kept} for r in range(n) if r != 1}


def test_exposed_comm_what_if_does_not_count_a_wait_as_communication(tmp_path):
    # Before: the suggestion's comm=0 averaged the ranks' own replays, where a default rank's NCCL
    # kernel (260 µs: 200 waiting for rank 1, 60 of work) vanished: 4 ranks predicted 462 µs a
    # step (1.34x).  The job's step with comm=0 is the late rank's without its 60 µs: 683 µs, as a
    # run without the all-reduce's work measures (run B).
    specs = [G.RankSpec(), G.RankSpec(kernels=LATE), G.RankSpec(), G.RankSpec()]
    # (1e11 model FLOPs a step: an MFU of about 15% on an H100, so that predicted_mfu is known)
    _, a, d = _run(tmp_path, specs, name="a", options=Options(critical_path=True, model_flops_per_step=1e11))
    _, _, db = _run(tmp_path, [G.RankSpec(comm_ns=0), G.RankSpec(kernels=LATE, comm_ns=0), G.RankSpec(comm_ns=0),
                               G.RankSpec(comm_ns=0)], name="b")
    sg = _what_if(d, "exposed_communication")
    jb = db["job"]["critical_path"]
    kept_b = [st["length_ns"] for st in jb["steps"] if st["kept"]]
    measured_b = sum(kept_b) / len(kept_b)
    wi = sg["what_if"]
    assert abs(wi["predicted_step_ns"] - measured_b) <= 0.05 * measured_b, (wi, measured_b)
    assert wi["predicted_speedup"] <= sg["est_speedup"]  # within its upper bound 1 / (1 - bar)
    ja = d["job"]["critical_path"]
    kept_a = [st["length_ns"] for st in ja["steps"] if st["kept"]]
    # the speed-up is the job path's measured kept steps over the predicted; the MFU moves with it
    assert abs(wi["predicted_speedup"] - sum(kept_a) / len(kept_a) / wi["predicted_step_ns"]) < 1e-3
    assert d["job"]["mfu"] and abs(wi["predicted_mfu"] - d["job"]["mfu"] * wi["predicted_speedup"]) < 1e-3
    # the straggler's own what-if (rank 1 arriving with the others): 743 - 200 = 543 µs a step
    ranks = list(a.ranks)
    got = critical.rank_late([r.critical_path for r in ranks], a.table(), [(r.file, r.rank) for r in ranks], {1})
    assert got["steps"][:4] == [543_000] * 4


def test_one_rank_of_a_job_alone_withholds_the_comm_what_if(tmp_path):
    # Rank 0 of the 4-rank job above loaded alone: its 260 µs all-reduce kernel is 200 µs of waiting
    # for rank 1 (not loaded) and 60 µs of work; the group's other 3 members are absent.  Its own
    # replay of comm=0 says 483 µs (743 - 260: the wait removed as if it were transfer), against
    # 743 - 60 = 683 µs once the all-reduce's work is gone: the prediction is withheld with a
    # warning naming why, the bar's upper bound stays.  Other changes keep the rank's replay.
    specs = [G.RankSpec(), G.RankSpec(kernels=LATE), G.RankSpec(), G.RankSpec()]
    sim = G.simulate(specs, 4)
    paths = G.write(sim, tmp_path / "job")
    a, got = _rank_replays(_MP(), [paths[0]], "comm=0")
    assert [x for x in got[0][1:3]] == [483_000, 483_000]  # what the replay alone predicts (steps 1, 2)
    d = a.to_dict()
    cp = d["job"]["critical_path"]
    assert cp["unstitched"]["members_absent"] == 4 and cp["unstitched"]["rows_on_path"] >= 3
    sg = _what_if(d, "exposed_communication")
    assert sg.get("what_if") is None and sg["est_speedup"] > 1
    assert any(w.startswith("what-if of removing communication withheld") for w in d["warnings"])
    # every rank loaded: the job's prediction (the test above holds it to run B) and no such warning
    d4 = analyze(load(paths, use_cache=False, jobs=1), ON).to_dict()
    assert _what_if(d4, "exposed_communication")["what_if"]["predicted_step_ns"] > 483_000
    assert "unstitched" not in d4["job"]["critical_path"] or not d4["job"]["critical_path"]["unstitched"]["rows_on_path"]
    assert not any(w.startswith("what-if of removing communication withheld") for w in d4["warnings"])


class _MP:
    """A monkeypatch for a test that spies without pytest's fixture (undone at once: the spy's
    analysis has run when ``_rank_replays`` returns)."""

    def setattr(self, obj, name, value):
        self._undo = (obj, name, getattr(obj, name))
        setattr(obj, name, value)

    def __del__(self):
        if hasattr(self, "_undo"):
            setattr(*self._undo)


def _rank_replays(monkeypatch, paths, change):
    """Each rank's replay of ``change`` per step, as the analysis built its graph."""
    got = {}
    real = critical.step_paths

    def spy(df, device, windows, main_tid, names, g, **kw):
        got[len(got)] = replay.Replay(df, g, windows, main_tid).run(replay.parse(change))[0]
        return real(df, device, windows, main_tid, names, g=g, **kw)

    monkeypatch.setattr(critical, "step_paths", spy)
    a = analyze(load(paths, use_cache=False, jobs=1), ON)
    return a, got


@pytest.mark.parametrize(("a_spec", "b_spec", "change"), [
    # a softmax kernel 2x slower (100 µs) in run A, fixed in B: A's step 793 µs, B's 743
    (dict(kernels=[(G.GEMM, 200_000), (G.SOFTMAX, 100_000), (G.GEMM, 200_000)]), {}, "kclass[softmax_reduce]/2"),
    # data loading 300 µs in A, none in B: the host launches the step's first kernel that much later
    (dict(dl_ns=300_000), dict(dl_ns=0), "data_loading=0"),
], ids=["slow_kernel_class", "data_loading"])
def test_fixed_bottleneck_pairs_two_ranks(tmp_path, monkeypatch, a_spec, b_spec, change):
    # two balanced ranks (no wait), run A with the bottleneck, run B fixed: each rank's replay of A
    # with the change predicts B's measured step within 5% (and never above A's)
    sim_a = G.simulate([G.RankSpec(**a_spec), G.RankSpec(**a_spec)], 4)
    sim_b = G.simulate([G.RankSpec(**b_spec), G.RankSpec(**b_spec)], 4)
    pa = G.write(sim_a, tmp_path / "a")
    _, got = _rank_replays(monkeypatch, pa, change)
    for r in range(2):
        for k in range(4):
            pred, want, meas = got[r][k], sim_b.step_ns[r][k], sim_a.step_ns[r][k]
            assert abs(pred - want) <= 0.05 * want and pred <= meas, (r, k, pred, want, meas)


def test_ranks_with_different_step_counts_are_not_stitched(tmp_path):
    # rank 1 recorded no ProfilerStep spans: its whole trace is one "step"; before, the job's path
    # joined it to rank 0's step 1 (a 3.37 ms "step 1" on rank 1) and comm=0 was predicted from
    # the ranks' replays (1.21x); now: not stitched, what-ifs withheld, both said in warnings
    _, _, d = _run(tmp_path, [G.RankSpec(), G.RankSpec(kernels=LATE, no_steps=True)])
    job = d["job"]["critical_path"]
    assert "steps" not in job
    assert any("step counts differ" in w for w in d["warnings"])
    assert _what_if(d, "exposed_communication").get("what_if") is None
    assert any("what-if predictions withheld" in w for w in d["warnings"])


def test_unmatched_collectives_withhold_the_what_if(tmp_path):
    # rank 1's all-reduces carry other sequence numbers (they match nothing), but rank 0 still
    # waited 200 µs for it inside each NCCL kernel: no rank's wait can be told from its work
    _, _, d = _run(tmp_path, [G.RankSpec(), G.RankSpec(kernels=LATE, solo=True)])
    job = d["job"]["critical_path"]
    assert job["unstitched"]["rows_on_path"] > 0 and job["wait_rank_ns"] == {}
    assert _what_if(d, "exposed_communication").get("what_if") is None
    assert any("what-if predictions withheld" in w for w in d["warnings"])


@pytest.mark.parametrize("kw", [dict(graph=True), dict(skew_ns=5_000_000_000), dict(skew_ns=-150_000)],
                         ids=["cuda_graph", "skew_5s", "skew_-150us"])
def test_graphs_and_clock_skew(tmp_path, kw):
    # CUDA-graph launches (every kernel of a step from one cudaGraphLaunch) and a rank's clock off
    # by 5 s or by -150 µs (less than the 200 µs wait): the same job path as the plain run
    specs = [G.RankSpec(**{k: v for k, v in kw.items() if k == "graph"}), G.RankSpec(kernels=LATE, **kw)]
    sim, _, d = _run(tmp_path, specs)
    for st in d["job"]["critical_path"]["steps"][:4]:
        assert st["length_ns"] == 743_000 and st["by_category_ns"]["compute_gemm"] == 600_000
        assert sum(st["by_category_ns"].values()) == st["length_ns"]


def test_two_gpus_in_one_file(tmp_path):
    # one process driving devices 0 and 1 in one file: device 1's activities are left out with a
    # warning; device 0's path is the one the 2-file job gives that rank
    _, _, d = _run(tmp_path, [G.RankSpec(), G.RankSpec(kernels=LATE, device=1)], one_file=True)
    (r,) = d["ranks"]
    assert any("devices other than 0 are left out" in w for w in d["warnings"])
    for st in r["critical_path"]["steps"][:4]:
        assert st["length_ns"] == 743_000 and st["by_category_ns"]["exposed_comm"] == 260_000


def test_export_of_a_gpu_job(tmp_path):
    # 3 ranks, rank 1 late and its clock 3 s ahead: the export is valid by the importer's rules
    # (tests/test_perfetto_export.check_trace: ph, pid/tid metadata, one s and one f per flow,
    # each inside a slice of its thread), each rank's path slices sum to its steps' lengths, and
    # the path's arrows join events of the rank (a kernel to the next one on the path)
    from tests.test_perfetto_export import check_trace, path_slices, read
    from tracelens.cli import main

    sim = G.simulate([G.RankSpec(), G.RankSpec(kernels=LATE, skew_ns=3_000_000_000), G.RankSpec()], 4)
    G.write(sim, tmp_path / "job")
    out = tmp_path / "out.json.gz"
    assert main(["export-trace", str(tmp_path / "job"), "-o", str(out)]) == 0
    evs = check_trace(read(out))
    got = path_slices(evs)
    for r in range(3):
        assert [got[(r + 1, k + 1)] for k in range(4)] == sim.step_ns[r]
    # the what-if tracks: the job's comm=0 prediction (683 µs: the late rank's step without the
    # all-reduce's 60 µs), on every rank; before, rank 0's own replay showed 483 µs (its 200 µs
    # wait for rank 1 removed as if it were communication)
    wi = [e for e in evs if e["ph"] == "X" and e["cat"] == "what_if"]
    assert wi and all(round(e["dur"] * 1000) in (683_000, 200_000, 400_000) for e in wi), sorted({e["dur"] for e in wi})
    assert {e["pid"] for e in wi if round(e["dur"] * 1000) == 683_000} == {1, 2, 3}
    # the arrows of rank 1 (pid 2): each end inside the innermost trace event holding it; the
    # path runs gemm -> softmax -> gemm -> all-reduce -> the sync that waited for it
    xs = [e for e in evs if e["ph"] == "X" and e["pid"] == 2 and e["cat"] not in ("critical_path", "what_if")]

    def holder(p):
        c = [x for x in xs if x["tid"] == p["tid"] and x["ts"] - 1e-6 <= p["ts"] <= x["ts"] + x["dur"] + 1e-6]
        return min(c, key=lambda x: x["dur"])["name"].split("(")[0][:12]
    pts = {}
    for e in evs:
        if e["ph"] in "sf" and e["pid"] == 2 and e["name"] == "critical path":  # the rank's own arrows
            pts.setdefault(e["id"], {})[e["ph"]] = holder(e)
    arrows = {(p["s"], p["f"]) for p in pts.values()}
    assert {("sm90_xmma_ge", "void at::nat"), ("void at::nat", "sm90_xmma_ge"), ("sm90_xmma_ge", "ncclDevKerne"),
            ("ncclDevKerne", "cudaStreamSy")} <= arrows, arrows
    # the job's path across ranks: each step's one hop (the job's path starts on the rank whose
    # window ends last, at its end, and crosses to late rank 1 at the all-reduce) is one arrow from
    # rank 1's path track (pid 2), just before its start of the all-reduce (its clock 3 s ahead),
    # to the waiting rank's path track at rank 1's arrival on that rank's clock: 200 µs into its
    # 260 µs all-reduce kernel (tests/test_critical_gpu_ranks' module text)
    d = analyze(load([str(p) for p in sorted((tmp_path / "job").iterdir())], use_cache=False, jobs=1), ON).to_dict()
    hops = [h for st in d["job"]["critical_path"]["steps"] for h in st["hops"]]
    assert len(hops) == 4 and all(h["waited_for"] == 1 and h["rank"] in (0, 2) and h["collective"] == "allreduce" for h in hops)
    assert all(h["wait_ns"] == 200_000 for h in hops)
    cross = [e for e in evs if e["ph"] in "sf" and e["name"] == "critical path across ranks"]
    by_id: dict = {}
    for e in cross:
        by_id.setdefault(e["id"], {})[e["ph"]] = e
    assert len(by_id) == 4 and all(set(v) == {"s", "f"} for v in by_id.values())
    path_tid = {e["pid"]: e["tid"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == "critical path"}
    for (s, f), h in zip(sorted(((v["s"], v["f"]) for v in by_id.values()), key=lambda sf: sf[0]["ts"]), hops):
        assert s["pid"] == 2 and f["pid"] == h["rank"] + 1 and s["tid"] == path_tid[2] and f["tid"] == path_tid[f["pid"]]
        assert f["bp"] == "e"


def test_export_of_two_gpus_in_one_file_keeps_their_streams_apart(tmp_path):
    # one process's file with devices 0 and 1, both using streams 7 and 20: before, device 1's
    # kernels went on the "GPU 0 stream 7" track among device 0's, overlapping slices that do not
    # nest (the importer nests slices per thread); now each device's streams have their own tracks
    from tests.test_perfetto_export import check_trace, read
    from tracelens.export.perfetto import export_trace

    sim = G.simulate([G.RankSpec(), G.RankSpec(kernels=LATE, device=1)], 4)
    out = tmp_path / "o.json"
    export_trace(G.write(sim, tmp_path / "job", one_file=True), out)
    evs = check_trace(read(out))
    names = {e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    gpu = {t: n for t, n in names.items() if n.startswith("GPU ")}
    assert sorted(gpu.values()) == ["GPU 0 stream 20", "GPU 0 stream 7", "GPU 1 stream 20", "GPU 1 stream 7"]
    # 13 kernels per device on stream 7 (3 a step for 4 steps, 1 in the closing step)
    per = {n: sum(1 for e in evs if e["ph"] == "X" and e["tid"] == t and e["cat"] == "kernel") for t, n in gpu.items()}
    assert per["GPU 0 stream 7"] == per["GPU 1 stream 7"] == 13
    for t in gpu:  # on each GPU track, slices nest or follow each other
        iv = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs if e["ph"] == "X" and e["tid"] == t)
        assert all(b0 <= a1 + 1e-6 or b1 <= b0 + 1e-6 for (_, b0), (a1, b1) in zip(iv, iv[1:])), t


def test_overlapped_all_reduce_pair(tmp_path, monkeypatch):
    # DDP-style: the all-reduce (400 µs of work) is issued after the first gemm and the softmax and
    # the second gemm (250 µs) run beside it; the step ends with a cudaDeviceSynchronize.  Rank 1's
    # first gemm takes 400 µs, so the all-reduce ends 400 µs after rank 1 arrives: every step is
    # 20 + 5 + 400 + 400 + 3 + 5 = 833 µs.  Run B (no communication work) is set by rank 1's
    # compute alone: 20 + 5 + 650 + 3 + 5 = 683 µs.  Before, rank 1's replay of comm=0 said 650:
    # its device sync waited only for the last activity to end (the all-reduce), not for the
    # compute stream's last kernel; the job's what-if, from the path alone, 450.
    ov = [G.RankSpec(overlap=1, comm_ns=400_000), G.RankSpec(kernels=LATE, overlap=1, comm_ns=400_000)]
    sim_a = G.simulate(ov, 5)
    sim_b = G.simulate([G.RankSpec(overlap=1, comm_ns=0), G.RankSpec(kernels=LATE, overlap=1, comm_ns=0)], 5)
    assert sim_a.step_ns[1][1:] == [833_000] * 4 and sim_b.step_ns[1][1:] == [683_000] * 4
    a, got = _rank_replays(monkeypatch, G.write(sim_a, tmp_path / "a"), "comm=0")
    assert got[1][1:5] == [683_000] * 4  # rank 1 alone: its compute, then the sync
    d = a.to_dict()
    job = d["job"]["critical_path"]
    for st in job["steps"][1:5]:  # the path: rank 1's gemm, then the all-reduce's 400 µs on rank 0's side
        assert st["length_ns"] == 833_000 and st["by_category_ns"]["exposed_comm"] == 400_000
    sg = _what_if(d, "exposed_communication")
    kept = [k for k, st in enumerate(job["steps"]) if st["kept"]]
    want = sum(sim_b.step_ns[1][k] if k < 5 else job["steps"][k]["length_ns"] for k in kept) / len(kept)
    assert abs(sg["what_if"]["predicted_step_ns"] - want) <= 0.05 * want, (sg["what_if"], want)
    assert sg["what_if"]["predicted_speedup"] <= sg["est_speedup"]


def test_job_prediction_of_faster_gemms_with_a_late_rank(tmp_path, monkeypatch):
    # rank 1 late (first gemm 400 µs), every gemm 2x faster in run B: B's steps are
    # 743 - 300 (rank 1's gemms halved: 600 -> 300) = 443 µs.  Rank 0's own replay keeps its
    # 200 µs wait for rank 1 (543 µs): the job's prediction takes it less that wait (343) and the
    # late rank's 443, the larger: 443 µs, B exactly
    from dataclasses import replace as dc_replace

    from tracelens.analysis import suggest

    sim = G.simulate([G.RankSpec(), G.RankSpec(kernels=LATE)], 4)
    fast = [(G.GEMM, 100_000), (G.SOFTMAX, 50_000), (G.GEMM, 100_000)]
    sim_b = G.simulate([G.RankSpec(kernels=fast), G.RankSpec(kernels=[(G.GEMM, 200_000), *fast[1:]])], 4)
    change = "kclass[gemm]/2"
    a, got = _rank_replays(monkeypatch, G.write(sim, tmp_path / "a"), change)
    assert got[0][:4] == [543_000] * 4 and got[1][:4] == [443_000] * 4
    ranks = [dc_replace(r, what_if={change: got[i]}) for i, r in enumerate(a.ranks)]
    waits = critical.step_waits([r.critical_path for r in ranks], a.table(), [(r.file, r.rank) for r in ranks])
    assert waits[0][:4] == [200_000] * 4 and waits[1][:4] == [0] * 4
    pred = suggest.job_step_predictions(change, a.job.critical_path, ranks, waits)
    assert pred[:4] == sim_b.step_ns[0] == [443_000] * 4
