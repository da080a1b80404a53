"""The terminal summary of a report dict: the headline, the per-rank table, idle split,
communication, stragglers, the waterfall (``views.waterfall_layout``, as the TUI and the HTML
draw it), suggestions, the slowest steps and the warnings."""

from __future__ import annotations

from typing import Any

from tracelens.model.summary import kept_steps
from tracelens.model.units import fmt_ns
from tracelens.render import tables as views
from tracelens.render.nccl import behind_text
from tracelens.render.tables import fmt_speedup


def _pct(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100.0 * part / whole:5.1f}%"


def render_text(d: dict[str, Any]) -> str:
    """The terminal summary.  Every string from a trace or a saved report is made printable
    first (``views.printable``): no control character or escape sequence reaches the terminal."""
    d = views.printable_report(d)
    job = d["job"]
    if job.get("nccl") is not None and not d["ranks"]:  # NCCL logs / Flight Recorder dumps alone
        return nccl_text(d)
    lines = [f"tracelens {d['tool']['version']} — {job['ranks']} rank(s)"]
    if job.get("nccl_diagnosis"):
        lines.extend(verdict_lines(job["nccl_diagnosis"]))
    mfus = [(r["rank"], r["mfu"]) for r in d["ranks"]]
    h = views.headline(d)
    nwarn = f" ({h['warnings']} warning(s) at the end)" if h["warnings"] else ""
    if job["mfu"] is not None:
        r0 = d["ranks"][0]["mfu"] if d["ranks"] else {}
        hfu = f", HFU {100 * r0['hfu']:.2f}% (with recompute)" if r0.get("hfu") and r0.get("recompute_flops") else ""
        lines.append(f"MFU: {100 * job['mfu']:.2f}% {views.mfu_text(h)}{hfu}{nwarn}")
        if views.mfu_note(job):
            lines.append(f"     (the MFU is {views.mfu_note(job)})")
    else:
        lines.append(f"{h['why_unknown']}{nwarn}")
        if any(m["value"] is not None for _, m in mfus):
            lines.append("  known on: " + ", ".join(f"rank {rk} {100 * m['value']:.2f}%" for rk, m in mfus if m["value"] is not None))
    st = job["step_time_ns"]
    if st["mean"] is not None:
        lines.append(f"step time: mean {fmt_ns(st['mean'])}, p50 {fmt_ns(st['p50'])}, max {fmt_ns(st['max'])} (warm-up step excluded)")
    g = job["gpu_time_ns"]
    if g:
        w = sum(g[k] for k in ("idle", "compute", "exposed_comm", "exposed_memcpy"))
        lines.append(
            f"GPU time, all ranks: compute {_pct(g['compute'], w)}, idle {_pct(g['idle'], w)}, "
            f"exposed comm {_pct(g['exposed_comm'], w)}, exposed memcpy {_pct(g['exposed_memcpy'], w)}"
        )
    lines.append("")
    lines.append(f"{'rank':>4}  {'device':<24} {'steps':>5} {'step time':>10} {'MFU':>6} {'compute':>8} {'idle':>7} {'exp.comm':>8} {'exp.copy':>8}")
    for r in d["ranks"]:
        kept = kept_steps(r["steps"])
        mean = sum(s["dur_ns"] for s in kept) // len(kept) if kept else None
        g = r["gpu_time_ns"]
        w = r["window_ns"]
        name = views.device_label(r)[:24]
        lines.append(
            f"{r['rank']:>4}  {name:<24} {len(r['steps']):>5} {fmt_ns(mean):>10} "
            + (f"{100 * r['mfu']['value']:5.2f}% " if r["mfu"]["value"] is not None else f"{'-':>6} ")
            + " ".join(f"{_pct(g[k] if g else None, w):>8}" for k in ("compute", "idle", "exposed_comm", "exposed_memcpy"))
        )
    idle_rows = [(r["rank"], r["idle_ns"], r["window_ns"]) for r in d["ranks"] if r["idle_ns"]]
    if idle_rows:
        lines.append("")
        lines.append("GPU idle, by what the host was doing (% of the window):")
        keys = ("data_loading", "host_launch", "sync", "launch_latency", "pipeline_bubble", "other")
        # the idle table's bubble is the bubble's idle part (MFU.md 4.3: |I_pp|); the bubble itself (the waterfall's
        # bar, ranks[].pipeline.bubble_ns) adds the exposed P2P the stage waits on (|X_pp|): both shown where they differ
        heads = {"pipeline_bubble": "pp bubble idle"}
        lines.append(f"{'rank':>4}  " + " ".join(f"{heads.get(k, k.replace('_', ' ')):>15}" for k in keys))
        whole = []
        for rank, idle, w in idle_rows:
            lines.append(f"{rank:>4}  " + " ".join(f"{_pct(idle[k], w):>15}" for k in keys))
            r = next(x for x in d["ranks"] if x["rank"] == rank)
            bar = next((b["ns"] for b in r.get("waterfall") or [] if b["key"] == "pipeline_bubble"), None)
            if bar is not None and bar > idle["pipeline_bubble"]:
                whole.append(f"rank {rank} {_pct(bar, w)} ({_pct(idle['pipeline_bubble'], w)} idle + "
                             f"{_pct(bar - idle['pipeline_bubble'], w)} exposed P2P)")
        if whole:
            lines.append("  pipeline bubble (the waterfall's bar, JSON ranks[].pipeline.bubble_ns) = its idle part above + the "
                         "exposed P2P the stage waited on:")
            lines.append("    " + "; ".join(whole))
    paths = [(r["rank"], r.get("critical_path")) for r in d["ranks"] if r.get("critical_path") and r["critical_path"]["length_ns"]]
    if paths:
        lines.append("")
        lines.append("critical path (the chain of waits that set the step time; kept steps, % of its length):")
        for rank, cp in paths:
            total = cp["by_category_ns"]
            top = [kv for kv in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])) if 1000 * kv[1] >= cp["length_ns"]][:6]  # 0.1% and more
            lines.append(f"  rank {rank}: " + ", ".join(f"{k.replace('_', ' ')} {_pct(ns, cp['length_ns'])}" for k, ns in top))
            events: dict[str, int] = {}
            for st in cp.get("steps") or []:
                for ev in st["top_events"]:
                    events[ev["name"]] = events.get(ev["name"], 0) + ev["ns"]
            best = sorted(events.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            if best:
                lines.append("    longest on it: " + "; ".join(f"{(nm or '?')[:50]} ({fmt_ns(ns)})" for nm, ns in best))
        lines.extend(_job_path_lines(job.get("critical_path")))
    pipe = views.pipeline_summary_lines(d)
    if pipe:
        lines.append("")
        lines += pipe
    bound = [
        (r["rank"], s) for r in d["ranks"] for s in r["steps"]
        if not s["warmup"] and s["data_loading"] and s["data_loading"]["input_bound"] != "no"
    ]
    if bound:
        lines.append("")
        lines.append("input-bound steps (GPU waiting for the DataLoader; >= 20% highly, >= 5% moderately):")
        for rank, s in bound[:8]:
            dl = s["data_loading"]
            lines.append(f"  rank {rank} {s['name']}: {dl['input_bound']}, {100 * dl['fraction']:.1f}% of the step ({fmt_ns(dl['gpu_idle_ns'])})")
    comm = d["communication"]["by_group"]
    if comm:
        lines.append("")
        lines.append("communication (all ranks):")
        lines.append(f"  {'group':<14} {'collective':<14} {'count':>6} {'time':>10} {'exposed':>10} {'wait':>10} {'busbw':>11}")
        for g in comm[:10]:
            grp = (g["group"] or "?") + (f" ({g['group_desc']})" if g["group_desc"] else "")
            bw = f"{g['busbw_gbps_median']:.1f} GB/s" if g["busbw_gbps_median"] is not None else "-"
            wait = fmt_ns(g["wait_ns"]) if g["wait_ns"] is not None else "-"
            lines.append(
                f"  {grp[:14]:<14} {(g['collective'] or '?'):<14} {g['count']:>6} {fmt_ns(g['time_ns']):>10} "
                f"{fmt_ns(g['exposed_ns']):>10} {wait:>10} {bw:>11}"
            )
            nccl = views.nccl_join(g)  # --nccl: what NCCL's own records say of it
            if nccl:
                lines.append("      " + "; ".join(nccl))
        for note in views.comm_notes(d):
            lines.append(f"  {note}")
    verdict = views.straggler_verdict(d)
    if verdict and verdict[0] == "found":
        lines.append("")
        lines.append("straggler ranks:")
        for st in job["stragglers"]:
            lines.append(f"  rank {st['rank']}: {st['evidence']}")
    elif verdict:
        lines.append("")
        lines.append(f"straggler ranks: {verdict[1]}")
    bars, kind = views.waterfall(d)
    if bars:
        lines.append("")
        lines.append(views.waterfall_title(kind, " of the job") + ":")
        lines.append(waterfall_text(bars))
    if d["suggestions"]:
        lines.append("")
        lines.append("suggestions (largest possible win first):")
        for sg in d["suggestions"][:8]:
            est = sg["est_speedup"]
            up = f" — up to {fmt_speedup(est)} faster" if est else ""
            wi = sg.get("what_if")  # with --critical-path: the change replayed on the graph
            if wi:
                up += f"{',' if up else ' —'} {fmt_speedup(wi['predicted_speedup'])} faster replayed on the graph ({wi['change']})"
                if wi.get("beyond_bound"):
                    up += " (beyond this bar's bound: the change also removes time other bars hold)"
            ev = sg["evidence"]
            num = ""
            if "worst" in ev:
                num = f" ({ev['measure']}: {100 * ev['worst']:.1f}%)" if ev.get("unit") == "share" else f" ({ev['measure']}: {ev['worst']:g})"
            lines.append(f"  * {sg['title']}{num}{up}")
            lines.append(f"      {sg['detail']}")
    worst = sorted(
        ((s["dur_ns"], r["rank"], s) for r in d["ranks"] for s in r["steps"] if not s["warmup"]),
        key=lambda t: -t[0],
    )[:3]
    if worst:
        lines.append("")
        lines.append("slowest steps:")
        for dur, rank, s in worst:
            g = s["gpu_time_ns"]
            idle = f", idle {_pct(g['idle'], dur).strip()}" if g else ""
            lines.append(f"  rank {rank} {s['name']}: {fmt_ns(dur)}{idle}")
    if d.get("comparison"):
        from tracelens.render.compare import text_section

        lines.append("")
        lines.append(text_section(d["comparison"]).rstrip("\n"))
    if d["warnings"]:
        lines.append("")
        lines.extend(f"warning: {w}" for w in d["warnings"])
    return "\n".join(lines) + "\n"


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """The one-screen verdict of ``job.nccl_diagnosis``: what happened, the culprits and why, the
    first disagreement's calls, who is behind, the divergent calls' stack frames."""
    out = [f"NCCL verdict: {v['summary']}"]
    if v["culprits"]:
        out.append("  likely culprit(s): " + ", ".join(str(c) for c in v["culprits"]))
    m = v.get("first_mismatch")
    if m:
        out.append(f"  first disagreement: group {m['group']} seq {m['seq']} ({', '.join(m['fields'])}):")
        for c in m["calls"][:6]:
            out.append(f"    {', '.join(str(x) for x in c['members'][:12])}: {c['call']}")
    for g in v["groups"][:6]:
        if g.get("behind"):
            wait = g.get("waiting_for") or {}
            out.append(f"  group {g['group']}: behind: " + behind_text(g["behind"], 12)
                       + (f"; waiting in seq {wait['seq']}: {', '.join(str(x) for x in wait['members_in_it'][:12])}" if wait else ""))
        if g.get("not_completed"):
            nc = g["not_completed"]
            out.append(f"  group {g['group']}: seq {nc['seq']} never completed on {', '.join(str(x) for x in nc['members'][:12])}")
        if g.get("missing_members"):
            named = g.get("no_input") or []
            out.append(f"  group {g['group']}: {g['missing_members']} member(s) of {g['size']} not in the inputs"
                       + (f" ({', '.join(str(x) for x in named[:12])})" if named else ""))
    for f in (v.get("p2p_open") or [])[:4]:
        out.append(f"  point-to-point: {f['text']}")
    if v.get("watchdog") and v["verdict"] != "no_collectives":
        from tracelens.model.nccl import watchdog_text

        out.extend(f"  {watchdog_text(w)}" for w in v["watchdog"][:4])
    for f in v["frames"][:4]:
        if f["frames"]:
            out.append(f"  stack of {', '.join(str(x) for x in f['members'][:8])} ({f['call']}):")
            out.extend(f"      {fr.get('name')} at {fr.get('filename')}:{fr.get('line')}" for fr in f["frames"][:4])
    return out


def nccl_text(d: dict[str, Any]) -> str:
    """The summary of a job of NCCL records only: verdict, inputs, communicators, collectives."""
    job = d["job"]
    nccl = job["nccl"]
    lines = [f"tracelens {d['tool']['version']} — NCCL records: {len(nccl['inputs'])} input(s)"]
    lines.extend(verdict_lines(job["nccl_diagnosis"]))
    lines.append("")
    lines.append("inputs:")
    for i in nccl["inputs"][:20]:
        f = i["facts"]
        extra = []
        if f.get("nccl_version"):
            extra.append(f"NCCL {f['nccl_version']}")
        if f.get("fr_version"):
            extra.append(f"Flight Recorder {f['fr_version']}")
        for k in ("communicators", "unknown_lines", "other_nccl_lines", "warn_lines"):
            if f.get(k):
                extra.append(f"{k.replace('_', ' ')} {f[k]}")
        if f.get("transports"):
            extra.append("transports " + ", ".join(f"{t['transport']} x{t['connections']}" for t in f["transports"]))
        if f.get("tuning"):
            extra.append("algo/proto " + ", ".join(f"{t['op']} {t['algo']}/{t['proto']}" for t in f["tuning"][:4]))
        lines.append(f"  {i['path']} ({i['format']}): {i['records']} record(s)" + (f"; {'; '.join(extra)}" if extra else ""))
    if nccl["communicators"]:
        lines.append("")
        lines.append(f"communicators ({nccl.get('communicators_total', len(nccl['communicators']))}):")
        lines.append(f"  {'commId':<20} {'rank':>5} {'nranks':>6} {'host':<20} {'pid':>8} {'cudaDev':>7} {'busId':>8}")
        for c in nccl["communicators"][:16]:
            lines.append(f"  {str(c['comm_id'] or c['comm'])[:20]:<20} {c['rank'] if c['rank'] is not None else '-':>5} "
                         f"{c['nranks'] if c['nranks'] is not None else '-':>6} {str(c['host'])[:20]:<20} {c['pid'] or '-':>8} "
                         f"{c['cuda_dev'] if c['cuda_dev'] is not None else '-':>7} {c['bus_id'] or '-':>8}")
    if nccl["collectives"]:
        lines.append("")
        lines.append("collectives:")
        lines.append(f"  {'group':<22} {'collective':<14} {'records':>8} {'members':>7} {'seq':>15}")
        for c in nccl["collectives"][:20]:
            grp = str(c["group"])[:14] + (f" ({c['group_desc']})"[:8] if c["group_desc"] else "")
            span = f"{c['first_seq']}..{c['last_seq']}"
            lines.append(f"  {grp:<22} {c['collective'] or '?':<14} {c['records']:>8} {c['members']:>7} {span:>15}")
    if nccl.get("bandwidth"):
        bw = nccl["bandwidth"]
        lines.append("")
        lines.append(f"measured bandwidth ({nccl.get('bandwidth_total', len(bw))} row(s); nccl-tests, Inspector):")
        lines.append(f"  {'test':<18} {'collective':<13} {'ranks':>5} {'bytes':>12} {'place':<6} {'time us':>10} {'algbw':>7} {'busbw':>7} {'wrong':>5}")
        for b in bw[:24]:
            place = "-" if b["in_place"] is None else ("in" if b["in_place"] else "out")
            lines.append(f"  {str(b['test'] or '?')[:18]:<18} {str(b['collective'] or '?')[:13]:<13} "
                         f"{b['nranks'] if b['nranks'] is not None else '?':>5} {b['bytes'] if b['bytes'] is not None else '?':>12} {place:<6} "
                         f"{b['time_us'] if b['time_us'] is not None else '-':>10} {b['algbw_gbps'] if b['algbw_gbps'] is not None else '-':>7} "
                         f"{b['busbw_gbps'] if b['busbw_gbps'] is not None else '-':>7} {b['wrong'] if b['wrong'] is not None else '-':>5}")
    if d["warnings"]:
        lines.append("")
        lines.extend(f"warning: {w}" for w in d["warnings"])
    return "\n".join(lines) + "\n"


def waterfall_text(bars: list[dict[str, Any]], width: int = 40) -> str:
    """Horizontal bars laid out by ``views.waterfall_layout`` (the rows, parts and positions the
    TUI and the HTML draw): each loss bar starts where the previous one ended, the last ends at
    100%; glyphs from ``views.bar_cells``, so a bar is never drawn wider than a larger one."""
    from tracelens.model.units import fmt_pct

    out = []
    for row in views.waterfall_layout(bars):
        lead, glyphs = views.bar_cells(row["start"], row["fraction"], width)
        cells = (" " * lead + glyphs)[:width]
        out.append(f"  {row['label'][:38]:<38} {cells:<{width}} {fmt_pct(row['fraction'], 2):>7}")
        for p in row["parts"]:
            out.append(f"      {p['label'][:34]:<34} {'':<{width}} {fmt_pct(p['fraction'], 2):>7}")
        if row.get("note"):
            out.append(f"      ({row['note']})")
    return "\n".join(out)


class TextRenderer:
    """The terminal summary as UTF-8 bytes (``render_text``)."""

    name = "text"
    suffixes = (".txt", ".text")

    def render(self, report: dict[str, Any]) -> bytes:
        return render_text(report).encode()


RENDERER = TextRenderer()


def _job_path_lines(cp: Any) -> list[str]:
    """The job's path stitched across ranks (job.critical_path with ``steps``): by category over the
    kept steps, the chain of ranks of each kept step (first to last) and who waited for whom; nothing
    for a report without it (one rank, no --critical-path, an older report)."""
    if not isinstance(cp, dict) or not isinstance(cp.get("steps"), list) or not cp.get("length_ns"):
        return []
    total = cp.get("by_category_ns") or {}
    top = [kv for kv in sorted(total.items(), key=lambda kv: (-kv[1], str(kv[0]))) if 1000 * kv[1] >= cp["length_ns"]][:6]
    out = ["  job (stitched across ranks): " + ", ".join(f"{str(k).replace('_', ' ')} {_pct(ns, cp['length_ns'])}" for k, ns in top)]
    kept = [st for st in cp["steps"] if isinstance(st, dict) and st.get("kept")]
    for st in kept[:8]:
        chain = " -> ".join("?" if r is None else str(r) for r in st.get("ranks") or [])
        out.append(f"    step {st.get('step')}: {fmt_ns(st.get('length_ns'))}, ranks {chain or '?'}")
    if len(kept) > 8:
        out.append(f"    ... {len(kept) - 8} more kept steps")
    waits = [(w, late, ns) for w, by in (cp.get("wait_rank_ns") or {}).items() if isinstance(by, dict) for late, ns in by.items()]
    for w, late, ns in sorted(waits, key=lambda x: (-x[2], x[0], x[1]))[:6]:
        out.append(f"    rank {w} waited for rank {late}: {fmt_ns(ns)}")
    return out
