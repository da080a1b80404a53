"""The hang and mismatch diagnosis of a job's NCCL records (``NCCL_ROW_SCHEMA`` rows: NCCL logs,
Flight Recorder dumps), read alone: per process group, every member's sequence of collectives is
aligned by sequence number, and

* the first sequence number where members disagree (collective, element count, dtype, root or
  reduction op): the classic hang, one rank in a different collective.  The likely culprits are
  the members outside the most common call (all of them when no call is the majority);
* the members that never entered the group's furthest collective (their last sequence number is
  behind the others'): the ones the others wait for, the likely culprits of a hang without a
  mismatch;
* the collectives every member entered that never completed (Flight Recorder states): a hang
  inside the collective (network, GPU, a dead peer), not a divergence of the program;
* members the group's size says exist but no input holds (their dumps or logs are missing), and
  two inputs that claim one member (runs mixed together).

Point-to-point rows (send/recv) are counted, not aligned.  Everything is computed per group with
polars; the loop per group only assembles the report of the groups that have a finding.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import polars as pl

from tracelens.model.collectives import P2P
from tracelens.model.nccl import as_strings

FIELDS = ("collective", "count", "dtype", "root", "redop")  # what must agree across members at one seq
MAX_GROUPS = 20  # groups reported in full (the others counted)
GRID_MEMBERS = 64  # the collective timeline (``timeline``): members shown per group
GRID_SEQS = 48  # sequence numbers shown per group, around the first divergence
GRID_BEFORE = 31  # of which before it
# the timeline's cell letters: the record's state at (member, seq); "." no record (never entered, or not in the inputs)
STATE_LETTERS = {"completed": "C", "started": "S", "scheduled": "Q"}


def _call(r: dict[str, Any]) -> str:
    parts = [r.get("op_name") or r.get("collective") or "?"]
    if (r.get("ops") or 1) > 1:
        parts[0] += f" (first of {r['ops']} coalesced)"
    if r.get("count") is not None:
        parts.append(f"count {r['count']}")
    if r.get("dtype"):
        parts.append(str(r["dtype"]))
    if r.get("root") is not None and r.get("collective") in ("broadcast", "reduce", "gather", "scatter"):
        parts.append(f"root {r['root']}")
    if r.get("redop"):
        parts.append(str(r["redop"]))
    return " ".join(parts)


def _members(vals: list[str]) -> list[int | str]:
    out: list[int | str] = []
    for v in vals:
        out.append(int(v) if v is not None and v.lstrip("-").isdigit() else v)
    return sorted(out, key=lambda x: (isinstance(x, str), x))


def _frames(js: str | None, limit: int = 6) -> list[dict[str, Any]] | None:
    if not js:
        return None
    try:
        frames = json.loads(js)
    except ValueError:
        return None
    if not isinstance(frames, list):
        return None
    # the caller's frames first: torch's own (distributed_c10d, its logger wrapper) say nothing of where
    own = [f for f in frames if isinstance(f, dict) and "/torch/" not in str(f.get("filename", "")).replace("\\", "/")]
    return (own or frames)[:limit]


def _label(members: list[int | str]) -> str:
    if not members:
        return "-"
    shown = ", ".join(str(m) for m in members[:8]) + (f" (+{len(members) - 8} more)" if len(members) > 8 else "")
    return ("rank " if len(members) == 1 else "ranks ") + shown if all(isinstance(m, int) for m in members) else shown


MEMBERS_SCHEMA = {"group": pl.String, "member": pl.String, "group_rank": pl.Int64, "from_start": pl.Boolean}
MAX_P2P = 20  # open point-to-point calls reported


def split_shared_names(parses: list) -> list:
    """The parses with each Flight Recorder group name that the dumps' configs give different
    member lists (``split_group``, a DeviceMesh's tensor-parallel groups: one name on every rank,
    each pair of ranks its own group) made one group per list: "1 [0, 1]", "1 [2, 3]" (rows and
    ``pg_ranks``); without it the independent groups would be aligned as one (a false hang)."""
    lists: dict[str, set[tuple[int, ...]]] = {}
    for p in parses:
        for g, ranks in ((p.facts or {}).get("pg_ranks") or {}).items():
            lists.setdefault(g, set()).add(tuple(ranks))
    shared = {g for g, s in lists.items() if len(s) > 1}
    if not shared:
        return parses
    out = []
    for p in parses:
        own = {g: r for g, r in ((p.facts or {}).get("pg_ranks") or {}).items() if g in shared}
        if own:  # a copy: the parse itself keeps the names (the --nccl join pairs by them)
            names = {g: f"{g} {list(r)}" for g, r in own.items()}
            p = copy.copy(p)
            p.rows = p.rows.with_columns(pl.col("group").replace(names))
            p.facts = {**p.facts, "pg_ranks": {names.get(g, g): r for g, r in p.facts["pg_ranks"].items()}}
        out.append(p)
    return out


def expected_members(parses: list) -> pl.DataFrame:
    """``MEMBERS_SCHEMA``: the members each group's config lists (Flight Recorder's ``pg_config``,
    one rank's dump per group read), and for those whose dump the inputs hold, whether it kept
    every entry from the first (``from_start``: null where no dump of that rank was read)."""
    lists: dict[str, list[int]] = {}
    dumped: dict[int, bool] = {}
    for p in parses:
        f = p.facts or {}
        for g, ranks in (f.get("pg_ranks") or {}).items():
            lists.setdefault(g, ranks)
        if f.get("rank") is not None and "from_start" in f:  # a Flight Recorder dump (its rank, the file name's)
            dumped[f["rank"]] = dumped.get(f["rank"], True) and bool(f["from_start"])
    if not lists:
        return pl.DataFrame(schema=MEMBERS_SCHEMA)
    exp = (pl.DataFrame({"group": list(lists), "member": list(lists.values())},
                        schema={"group": pl.String, "member": pl.List(pl.Int64)})
           .with_columns(pl.int_ranges(0, pl.col("member").list.len()).alias("group_rank")).explode("member", "group_rank"))
    seen = pl.DataFrame({"member": list(dumped), "from_start": list(dumped.values())}, schema={"member": pl.Int64, "from_start": pl.Boolean})
    return (exp.join(seen, on="member", how="left").with_columns(pl.col("member").cast(pl.String))
            .unique(["group", "member"]).select(list(MEMBERS_SCHEMA)))


def diagnose(rows: pl.DataFrame, paths: list[str] | None = None, members: pl.DataFrame | None = None) -> dict[str, Any]:
    """The diagnosis of the rows of every input of a job (``NCCL_ROW_SCHEMA``); ``paths``: the
    inputs' names by their ``file`` number (the warnings on runs mixed together name them);
    ``members`` (``expected_members``): the members each group's config lists, of which a member
    whose dump was read from its first entry but holds none of the group never entered it (a
    culprit), and one whose dump is not in the inputs is named (the likely culprit of a group
    stuck in a collective every member seen entered)."""
    if rows.height == 0:
        return {"verdict": "no_collectives", "summary": "no collective records in the inputs", "culprits": [], "reason": None,
                "groups": [], "p2p_rows": 0, "p2p_open": [], "groups_checked": 0, "first_mismatch": None, "frames": [], "timeline": []}
    # (the rows' Categorical columns as String: the diagnosis joins them with String frames, the groups' configs and
    # its timeline grid)
    rows = as_strings(rows).with_columns(pl.col("member").fill_null(pl.format("file{}", "file")))
    p2p = pl.col("collective").is_in(list(P2P))
    n_p2p = int(rows.select(p2p.sum()).item())
    coll = rows.filter(~p2p)
    # one row per (group, member, seq): a member recorded twice at a seq (two inputs claim it) is kept once, and said
    dup = (coll.group_by("group", "member", "seq").agg(pl.col("file").n_unique().alias("files"))
           .filter(pl.col("files") > 1))
    # a coalesced group (several calls of one input at one seq: Flight Recorder's ops of a coalesced collective, the
    # ops of an NCCL group) is compared whole: its signature is every call's, in order, and it counts its calls
    key = ["group", "member", "seq", "file"]
    sig = pl.concat_str([pl.col(f).cast(pl.String).fill_null("") for f in FIELDS], separator="\x1f")
    coll = (coll.sort(*key, "order").with_columns(sig.str.join("\x1e").over(key).alias("sig"), pl.len().over(key).alias("ops"))
            .unique(["group", "member", "seq"], keep="first", maintain_order=True))
    # only Flight Recorder knows whether a collective completed (a log line is its enqueue)
    coll = coll.with_columns(((pl.col("source") == "flight_recorder") & (pl.col("state") != "completed")).alias("open"))
    per_member = coll.group_by("group", "member").agg(
        pl.col("seq").min().alias("first_seq"), pl.col("seq").max().alias("last_seq"),
        pl.col("seq").filter("open").min().alias("first_open"),
        pl.col("rank").drop_nulls().first().alias("rank"),
    )
    groups = per_member.group_by("group").agg(
        pl.len().alias("seen"), pl.col("last_seq").max().alias("furthest"), pl.col("last_seq").min().alias("behindmost"),
        pl.col("first_seq").max().alias("common_from"),
    ).join(coll.group_by("group").agg(pl.col("group_size").max().alias("size"), pl.col("group_desc").drop_nulls().first()),
           on="group", how="left")
    # per (group, seq): the calls the members made, the most common one, who differs
    at = (coll.join(groups.select("group", "common_from"), on="group").filter(pl.col("seq") >= pl.col("common_from"))
          .group_by("group", "seq", "sig").agg(pl.col("member").sort().alias("members"), pl.len().alias("n"),
                                               *[pl.col(f).first() for f in (*FIELDS, "op_name", "frames", "ops")]))
    nsig = at.group_by("group", "seq").agg(pl.len().alias("calls"), pl.col("n").max().alias("top"), pl.col("n").sum().alias("entered"))
    first_bad = nsig.filter(pl.col("calls") > 1).group_by("group").agg(pl.col("seq").min().alias("mismatch_seq"))
    groups = groups.join(first_bad, on="group", how="left")
    stuck = (coll.join(groups.select("group", "seen"), on="group")
             .filter("open").group_by("group", "seq")
             .agg(pl.len().alias("open"), pl.col("seen").first(), pl.col("member").sort().alias("open_members"),
                  pl.col("member").filter(pl.col("state") == "scheduled").sort().alias("scheduled"),
                  pl.col("member").filter(pl.col("state") == "started").sort().alias("started"))
             .join(nsig.select("group", "seq", "entered"), on=["group", "seq"], how="left"))
    all_entered_open = (stuck.filter(pl.col("entered") == pl.col("seen")).group_by("group")
                        .agg(pl.col("seq").min().alias("open_seq")))
    groups = groups.join(all_entered_open, on="group", how="left").sort("group")
    # members the groups' configs list that hold no record of the group: "never_in" (their dump, read from its
    # first entry, has none: they never called it) and "no_input" (no dump of theirs in the inputs)
    if members is not None and members.height:
        absent = (members.join(groups.select("group"), on="group", how="semi")
                  .join(per_member.select("group", "member"), on=["group", "member"], how="anti")
                  .group_by("group").agg(pl.col("member").filter(pl.col("from_start").fill_null(False)).alias("never_in"),
                                         pl.col("member").filter(pl.col("from_start").is_null()).alias("no_input")))
        groups = groups.join(absent, on="group", how="left")
    else:
        groups = groups.with_columns(pl.lit(None, pl.List(pl.String)).alias("never_in"), pl.lit(None, pl.List(pl.String)).alias("no_input"))
    groups = groups.with_columns(pl.col("never_in", "no_input").fill_null([]))
    # the seq the members that never called the group were waited for: the first one another member has not completed
    groups = groups.join(per_member.group_by("group").agg(pl.col("first_open").min().alias("open_from")), on="group", how="left")

    out_groups: list[dict[str, Any]] = []
    p2p_open = _p2p_open(rows.filter(p2p), members, rows.filter(pl.col("source") == "flight_recorder")["member"].unique())
    verdict, culprits, reason, summary, first_mismatch, frames_out = "ok", [], None, None, None, []
    hang_group = None  # the group whose members behind gave the verdict "hang"
    findings = groups.filter(pl.col("mismatch_seq").is_not_null() | (pl.col("behindmost") < pl.col("furthest"))
                             | pl.col("open_seq").is_not_null() | (pl.col("size") > pl.col("seen"))
                             | (pl.col("never_in").list.len() > 0))
    for g in findings.head(MAX_GROUPS).iter_rows(named=True):
        name = g["group"]
        pm = per_member.filter(pl.col("group") == name)
        entry: dict[str, Any] = {"group": name, "group_desc": g["group_desc"], "size": g["size"], "members_seen": g["seen"],
                                 "furthest_seq": g["furthest"], "first_mismatch": None, "behind": [], "not_completed": None,
                                 # (a member whose dump holds no record of the group is in the inputs: not missing)
                                 "missing_members": max(0, g["size"] - g["seen"] - len(g["never_in"])) if g["size"] else 0,
                                 "no_input": _members(g["no_input"]), "never_called": _members(g["never_in"])}
        if g["mismatch_seq"] is not None:
            calls = at.filter((pl.col("group") == name) & (pl.col("seq") == g["mismatch_seq"])).sort("n", "sig", descending=[True, False])
            cs = calls.to_dicts()
            majority = cs[0]["n"] > cs[1]["n"]
            odd = [m for c in (cs[1:] if majority else cs) for m in c["members"]]
            differ = [f for f in FIELDS if len({c[f] for c in cs}) > 1]
            if len({c["ops"] for c in cs}) > 1 or not differ:  # the calls of a coalesced group differ past its first
                differ.append("coalesced calls")
            entry["first_mismatch"] = {
                "seq": g["mismatch_seq"], "fields": differ,
                "calls": [{"call": _call(c), "members": _members(c["members"]), **{f: c[f] for f in FIELDS},
                           "frames": _frames(c["frames"])} for c in cs],
                "culprits": _members(odd), "majority": majority,
            }
            if first_mismatch is None:
                first_mismatch = {"group": name, **entry["first_mismatch"]}
                verdict = "mismatch"
                culprits = _members(odd)
                others = cs[0] if majority else None
                reason = (f"at seq {g['mismatch_seq']} of group {name}"
                          + (f" ({g['group_desc']})" if g["group_desc"] else "") + ": "
                          + "; ".join(f"{_label(_members(c['members']))} called {_call(c)}" for c in cs)
                          + (f" — {_label(culprits)} differ(s) from the others ({_call(others)})" if majority
                             else " — no call is the majority: each side may be the culprit")
                          + f"; they disagree on {', '.join(differ)}")
                frames_out = [{"members": _members(c["members"]), "call": _call(c), "frames": _frames(c["frames"])} for c in cs]
        if g["behindmost"] < g["furthest"]:
            behind = pm.filter(pl.col("last_seq") < g["furthest"]).sort("last_seq", "member")
            ahead = pm.filter(pl.col("last_seq") == g["furthest"])
            nxt = at.filter((pl.col("group") == name) & (pl.col("seq") == behind["last_seq"].min() + 1)).sort("n", descending=True)
            waited = nxt.row(0, named=True) if nxt.height else None
            entry["behind"] = [{"member": _members([b["member"]])[0], "rank": b["rank"], "last_seq": b["last_seq"]}
                               for b in behind.iter_rows(named=True)]
            entry["waiting_for"] = ({"seq": int(behind["last_seq"].min()) + 1, "call": _call(waited),
                                     "members_in_it": _members(waited["members"]), "frames": _frames(waited["frames"])}
                                    if waited else None)
            if verdict in ("ok", "incomplete", "incomplete_inputs"):
                verdict, hang_group = "hang", name
                culprits = _members(behind["member"].to_list())
                last = behind["last_seq"].min()
                reason = (f"group {name}" + (f" ({g['group_desc']})" if g["group_desc"] else "")
                          + f": {_label(culprits)} never entered seq {last + 1}"
                          + (f" ({_call(waited)}), which {_label(_members(ahead['member'].to_list()))} entered (furthest seq "
                             f"{g['furthest']}); {_label(culprits)} stopped at seq {last}" if waited else
                             # the others' records start past it (their ring buffers wrapped, or they are of another run)
                             f": {_label(culprits)} stopped at seq {last}, before the others' first recorded seq "
                             f"({g['common_from']}; {_label(_members(ahead['member'].to_list()))} reached seq {g['furthest']}): "
                             "a rank far behind, or a dump of another run (see the warnings)"))
                frames_out = ([{"members": _members(waited["members"]), "call": _call(waited), "frames": _frames(waited["frames"])}]
                              if waited else [])
                last_rows = coll.filter((pl.col("group") == name) & pl.col("member").is_in(behind["member"].to_list())
                                        & (pl.col("seq") == pl.col("seq").max().over("member")))
                frames_out += [{"members": _members([r["member"]]), "call": f"(last recorded) {_call(r)}", "frames": _frames(r["frames"])}
                               for r in last_rows.head(4).iter_rows(named=True)]
        if g["never_in"]:
            # a member whose dump holds every entry it made and none of this group's: it never entered the group's first
            # open collective (or the first one recorded) that the others did
            never = _members(g["never_in"])
            s_at = g["open_from"] if g["open_from"] is not None else g["common_from"]
            waited = at.filter((pl.col("group") == name) & (pl.col("seq") == s_at)).sort("n", descending=True)
            w0 = waited.row(0, named=True) if waited.height else None
            entry["behind"] += [{"member": m, "rank": m if isinstance(m, int) else None, "last_seq": None} for m in never]
            if entry.get("waiting_for") is None:
                entry["waiting_for"] = ({"seq": int(s_at), "call": _call(w0), "members_in_it": _members(w0["members"]),
                                         "frames": _frames(w0["frames"])} if w0 else None)
            said = (f"{_label(never)} never entered seq {s_at}" + (f" ({_call(w0)})" if w0 else "")
                    + (f", which {_label(_members(w0['members']))} entered" if w0 else "")
                    + f"; {_label(never)}'s dump holds every entry from the first and none of this group's")
            if verdict == "hang" and hang_group == name:
                culprits = _members([str(m) for m in culprits + never])  # this group's members behind, and these
                reason += "; " + said
            elif verdict in ("ok", "incomplete", "incomplete_inputs"):
                verdict, culprits = "hang", never
                reason = f"group {name}" + (f" ({g['group_desc']})" if g["group_desc"] else "") + ": " + said
                frames_out = [{"members": _members(w0["members"]), "call": _call(w0), "frames": _frames(w0["frames"])}] if w0 else []
        if g["open_seq"] is not None:
            o = stuck.filter((pl.col("group") == name) & (pl.col("seq") == g["open_seq"])).row(0, named=True)
            entry["not_completed"] = {"seq": g["open_seq"], "members": _members(o["open_members"])}
            if verdict in ("ok", "incomplete_inputs"):
                verdict = "incomplete"
                reason = (f"group {name}" + (f" ({g['group_desc']})" if g["group_desc"] else "")
                          + f": every member seen entered seq {g['open_seq']} and "
                          f"{_label(_members(o['open_members']))} never completed it: a hang inside the collective "
                          "(a peer not in the inputs, the network, a GPU), not a divergence of the program")
                if g["no_input"]:  # the members whose dumps are missing: the others wait for one of them
                    culprits = _members(g["no_input"])
                    reason += (f"; {_label(culprits)} of the group left no dump in the inputs: the likely culprit(s) (a rank "
                               "that crashed, or hung before it could dump)")
                elif o["started"] and o["scheduled"]:
                    # the others' kernels started (waiting for a peer); these never started theirs: their GPU is
                    # stuck in earlier work (a kernel that never ends, a stream blocked), the likely culprits
                    culprits = _members(o["scheduled"])
                    reason += (f"; {_label(_members(o['started']))} started it (waiting for a peer), {_label(culprits)} only "
                               "scheduled it (its GPU never started it: stuck in earlier work), the likely culprit(s)")
        if entry["missing_members"] and verdict == "ok":
            verdict = "incomplete_inputs"
            reason = (f"group {name} has {g['size']} members, the inputs hold {g['seen']}: the others' logs or dumps are missing"
                      + (f" ({_label(_members(g['no_input']))})" if g["no_input"] else ""))
        out_groups.append(entry)
    if p2p_open and verdict in ("ok", "incomplete", "incomplete_inputs"):
        # a send / recv never completed: its peer never posted the matching call (a hang, the peer the culprit), both
        # sides sent (or received) to each other (a deadlock), or both posted the pair (stuck inside the transfer)
        f0 = next((f for f in p2p_open if f["kind"] != "posted"), p2p_open[0])
        if f0["kind"] != "posted":
            verdict, culprits = "hang", f0["culprits"]
        elif verdict == "ok":
            verdict = "incomplete"
        if f0["kind"] != "posted" or reason is None:
            reason = f0["text"]
    if verdict == "ok":
        summary = f"consistent: {groups.height} group(s), every member at the same collectives ({coll.height} records)"
    else:
        summary = {"mismatch": "MISMATCH", "hang": "HANG", "incomplete": "STUCK", "incomplete_inputs": "INCOMPLETE"}[verdict] + ": " + reason
    timeline = _timeline(coll, per_member, groups, findings)
    warnings = []
    if dup.height:
        warnings.append(f"{dup.height} (group, member, seq) record(s) come from two inputs: the same rank given twice, "
                        "or dumps of different runs mixed together (the first kept)")
    warnings += _mixed_runs(rows.filter(~p2p), paths)
    return {"verdict": verdict, "summary": summary, "culprits": culprits, "reason": reason, "first_mismatch": first_mismatch,
            "frames": frames_out, "groups": out_groups, "groups_checked": groups.height,
            "groups_with_findings": findings.height, "p2p_rows": n_p2p, "p2p_open": p2p_open, "records": coll.height, "timeline": timeline, "warnings": warnings}


def _p2p_open(p2p: pl.DataFrame, members: pl.DataFrame | None, dumped: pl.Series) -> list[dict[str, Any]]:
    """The point-to-point calls of Flight Recorder that never completed, each with what its peer
    was doing: ``kind`` "never_posted" (the peer holds no open call with this member: it never
    posted the matching recv / send, the culprit), "missing" (no input of the peer), "deadlock"
    (both sides sent, or both received, to each other), "posted" (both posted the pair: stuck in
    the transfer).  The peer is the profiling name's (``send 0->1``: a group rank, made a global
    one by the group's config, else taken as one).  ``dumped``: the members the inputs' dumps hold
    records of (a dump is a rank's, of all its groups).  ``MAX_P2P`` of them, the culprits' first."""
    fr_rows = p2p.filter(pl.col("source") == "flight_recorder")
    if fr_rows.height == 0:
        return []
    present = pl.DataFrame({"member": dumped}, schema={"member": pl.String})
    if members is not None and members.height:
        present = pl.concat([present, members.filter(pl.col("from_start").is_not_null()).select("member")]).unique()
        ranks = members.select("group", "member", "group_rank")
        to_global = (pl.col("root").cast(pl.Int64).alias("group_rank"))
        opened = (fr_rows.filter(pl.col("state") != "completed").with_columns(to_global)
                  .join(ranks.rename({"member": "peer"}), on=["group", "group_rank"], how="left")
                  .with_columns(pl.col("peer").fill_null(pl.col("root").cast(pl.String))))
    else:
        opened = fr_rows.filter(pl.col("state") != "completed").with_columns(pl.col("root").cast(pl.String).alias("peer"))
    opened = (opened.filter(pl.col("peer").is_not_null())
              .sort("group", "member", "order").unique(["group", "member", "peer"], keep="first", maintain_order=True)
              .select("group", "member", "peer", "collective", "p2p_seq", "op_name", "count", "dtype"))
    if opened.height == 0:
        return []
    other = opened.select("group", pl.col("member").alias("peer"), pl.col("peer").alias("member"),
                          pl.col("collective").alias("peer_call"))
    there = present.select(pl.col("member").alias("peer"), pl.lit(True).alias("peer_in_inputs"))
    got = (opened.join(other, on=["group", "member", "peer"], how="left").join(there, on="peer", how="left")
           .with_columns(pl.when(pl.col("peer_call").is_not_null() & (pl.col("peer_call") == pl.col("collective"))).then(pl.lit("deadlock"))
                         .when(pl.col("peer_call").is_not_null()).then(pl.lit("posted"))
                         .when(pl.col("peer_in_inputs").is_null()).then(pl.lit("missing"))
                         .otherwise(pl.lit("never_posted")).alias("kind"))
           .with_columns(pl.col("kind").replace_strict({"never_posted": 0, "missing": 1, "deadlock": 2, "posted": 3}).alias("o"))
           .sort("o", "group", "member").head(MAX_P2P))
    out = []
    for r in got.iter_rows(named=True):
        me, peer = _members([r["member"]])[0], _members([r["peer"]])[0]
        call = f"{r['op_name'] or r['collective']} (p2p seq {r['p2p_seq']})"
        want = "recv" if r["collective"] == "send" else "send"
        text = f"group {r['group']}: rank {me}'s {call} never completed; " + {
            "never_posted": f"rank {peer} holds no open call with rank {me}: it never posted the matching {want}",
            "missing": f"rank {peer} left no dump in the inputs (the likely culprit)",
            "deadlock": f"rank {peer} is in a {r['peer_call']} to rank {me} too: both {r['collective']}, each waits for the other",
            "posted": f"rank {peer} posted the matching {r['peer_call']}: stuck inside the transfer (the network, a GPU)"}[r["kind"]]
        culprits = {"never_posted": [peer], "missing": [peer], "deadlock": _members([r["member"], r["peer"]]), "posted": []}[r["kind"]]
        out.append({"group": r["group"], "member": me, "peer": peer, "call": call, "kind": r["kind"], "culprits": culprits,
                    "text": text})
    return out


def _names(files: list, paths: list[str] | None) -> str:
    files = sorted(f for f in files if f is not None)
    shown = [paths[f] if paths and 0 <= f < len(paths) else f"input #{f}" for f in files[:4]]
    return ", ".join(shown) + (f" (+{len(files) - 4} more)" if len(files) > 4 else "")


def _mixed_runs(coll: pl.DataFrame, paths: list[str] | None) -> list[str]:
    """Signs that the inputs are not of one run, each a warning naming the files: two inputs that
    claim one member of a group, one group recorded with two sizes, and a member whose sequence
    numbers all lie after another's last one (one run's ranks never get that far apart in a group
    they all call: a rank of another run, or one stuck far behind).  Bounded: 4 findings each."""
    out = []
    claims = (coll.group_by("group", "member", "source").agg(pl.col("file").unique().sort().alias("files"))
              .filter(pl.col("files").list.len() > 1).sort("group", "member"))
    for r in claims.head(4).iter_rows(named=True):
        out.append(f"group {r['group']} member {r['member']} is claimed by {len(r['files'])} inputs ({_names(r['files'], paths)}): "
                   "the same rank given twice, or dumps of different runs mixed together")
    sizes = (coll.filter(pl.col("group_size").is_not_null()).group_by("group", "group_size").agg(pl.col("file").unique())
             .filter(pl.len().over("group") > 1).sort("group", "group_size"))
    for grp in sizes["group"].unique(maintain_order=True).head(4).to_list():
        part = sizes.filter(pl.col("group") == grp)
        out.append(f"group {grp} has {part.height} sizes in the inputs: " + "; ".join(
            f"{r['group_size']} in {_names(r['file'], paths)}" for r in part.iter_rows(named=True))
                   + " — dumps or logs of different runs mixed together")
    span = coll.group_by("group", "member").agg(pl.col("seq").min().alias("lo"), pl.col("seq").max().alias("hi"),
                                                pl.col("file").unique().alias("files"))
    apart = (span.join(span, on="group", suffix="_o").filter(pl.col("lo") > pl.col("hi_o"))
             .sort("group", "member", "member_o").unique(["group", "member"], keep="first", maintain_order=True))
    for r in apart.head(4).iter_rows(named=True):
        out.append(f"group {r['group']}: member {r['member']} ({_names(r['files'], paths)}) holds seq {r['lo']}..{r['hi']}, all after "
                   f"member {r['member_o']}'s last one {r['hi_o']} ({_names(r['files_o'], paths)}): sequence ranges of different runs "
                   "mixed together, or a rank stuck far behind")
    return out


def _timeline(coll: pl.DataFrame, per_member: pl.DataFrame, groups: pl.DataFrame, findings: pl.DataFrame) -> list[dict[str, Any]]:
    """Per group (those with a finding first, ``MAX_GROUPS`` in all) its members x sequence
    numbers: one string per member, a letter per seq (``STATE_LETTERS``, "." no record), over a
    window of ``GRID_SEQS`` seqs around the group's first divergence (the first mismatch, else
    the first seq a member never entered, else the first one not completed), which is named."""
    bad = set(findings["group"].to_list())
    order = sorted(groups.iter_rows(named=True), key=lambda g: (g["group"] not in bad, g["group"]))[:MAX_GROUPS]
    out = []
    for g in order:
        name = g["group"]
        pm = per_member.filter(pl.col("group") == name)
        if g["mismatch_seq"] is not None:
            kind, at = "mismatch", g["mismatch_seq"]
        elif g["behindmost"] < g["furthest"]:
            kind, at = "not_entered", g["behindmost"] + 1
        elif g["open_seq"] is not None:
            kind, at = "not_completed", g["open_seq"]
        else:
            kind, at = None, None
        first, last = int(pm["first_seq"].min()), int(g["furthest"])
        lo = max(first, (at if at is not None else last) - GRID_BEFORE)
        hi = min(last, lo + GRID_SEQS - 1)
        members = _members(pm["member"].to_list())
        shown = [str(m) for m in members[:GRID_MEMBERS]]
        cells = (coll.filter((pl.col("group") == name) & pl.col("seq").is_between(lo, hi) & pl.col("member").is_in(shown))
                 .select("member", "seq", pl.col("state").replace_strict(STATE_LETTERS, default="?").alias("c")))
        grid = (pl.DataFrame({"member": shown}).join(pl.DataFrame({"seq": pl.int_range(lo, hi + 1, eager=True)}), how="cross")
                .join(cells, on=["member", "seq"], how="left").with_columns(pl.col("c").fill_null("."))
                .sort("seq").group_by("member", maintain_order=True).agg(pl.col("c").str.join("")))
        states = dict(zip(grid["member"].to_list(), grid["c"].to_list(), strict=True))
        if kind == "mismatch":  # the members outside the most common call (all when none is the majority)
            calls = coll.filter((pl.col("group") == name) & (pl.col("seq") == at)).group_by("sig").agg(pl.col("member"), pl.len().alias("n"))
            calls = calls.sort("n", "sig", descending=[True, False]).to_dicts()
            odd = _members([m for c in (calls[1:] if calls[0]["n"] > calls[1]["n"] else calls) for m in c["member"]])
        elif kind == "not_entered":
            odd = _members(pm.filter(pl.col("last_seq") < g["furthest"])["member"].to_list())
        else:
            odd = []
        out.append({"group": name, "group_desc": g["group_desc"], "size": g["size"], "members_total": len(members),
                    "members": members[:GRID_MEMBERS], "states": [states[m] for m in shown],
                    "seq_from": lo, "seq_to": hi, "seq_first": first, "seq_last": last,
                    "divergence": None if kind is None else {"kind": kind, "seq": int(at)}, "odd_members": odd})
    return out


_WATCHDOG_SCHEMA = {"rank": pl.Int64, "seq": pl.Int64, "op": pl.String, "pg": pl.String, "last_enqueued": pl.Int64,
                    "last_completed": pl.Int64}


def diagnose_watchdog(items: list[dict[str, Any]], named: list[int], world: int | None = None) -> dict[str, Any] | None:
    """The verdict of PyTorch's watchdog timeouts alone (the logs of a job whose NCCL lines hold no
    collective: NCCL_DEBUG=INFO without the COLL subsystem, or no NCCL_DEBUG at all), or None when
    they say nothing.  Per process group, the furthest seq a rank timed out on; the likely culprits
    are the ranks behind it (timed out at an earlier seq of that group, or whose last enqueued work
    is before it, as a rank that did not time out says on its dump signal's line: they never
    entered it) and, where every timeout is of the default group, the ranks the logs name that
    logged no timeout at all.  Without them the ranks all timed out in one collective (STUCK: a
    hang inside it, or a rank whose log is not in the inputs, counted where ``world``, the largest
    communicator's size, says more ranks exist than the logs name).  Timeouts that name no group are one group only where each rank timed out on one seq
    (else the seqs of different groups would be compared: no verdict)."""
    if not items:
        return None
    every = pl.from_dicts(items, schema=_WATCHDOG_SCHEMA).filter(
        pl.col("rank").is_not_null())
    w = every.filter(pl.col("seq").is_not_null()).unique(["rank", "seq", "pg"])
    if w.height == 0:
        return None
    if w.filter(pl.col("pg").is_null()).group_by("rank").len().select((pl.col("len") > 1).any()).item():
        return None  # a rank timed out on two seqs of unnamed groups: which group each is, the logs do not say
    w = w.with_columns(pl.col("pg").fill_null("?"))
    g = w.group_by("pg").agg(pl.col("seq").max().alias("at"), pl.col("rank").n_unique().alias("ranks")).sort("pg")
    # the status of a rank that did not time out in a group (its dump signal's line: seq null), of a group named
    status = (every.filter(pl.col("seq").is_null() & pl.col("pg").is_not_null() & pl.col("last_enqueued").is_not_null())
              .join(g.select("pg"), on="pg", how="semi"))
    w = pl.concat([w, status]).join(g, on="pg")
    timed = w.group_by("pg", "rank").agg(pl.col("seq").max(), pl.col("last_enqueued").max(), pl.col("at").first())
    behind = timed.filter((pl.col("seq") < pl.col("at")) | (pl.col("last_enqueued") < pl.col("at"))).sort("pg", "rank")
    # ranks that logged no timeout: those the logs name, where the timeouts are of one group, the default one (PG 0,
    # or one the lines do not name): a subgroup's members are not every rank the logs name.  The world's size says
    # how many ranks there are, not that one is silent (the logs of a node, of some ranks only, are common inputs)
    silent = sorted(set(named) - set(w["rank"].to_list())) if g.height == 1 and g["pg"][0] in ("0", "?") else []
    seen = set(named) | set(w["rank"].to_list())
    unseen = (f" (the logs hold {len(seen)} of the job's {world} ranks: the others' are not in the inputs)"
              if world and world > len(seen) else "")
    op = w.filter(pl.col("seq") == pl.col("at")).group_by("pg").agg(pl.col("op").drop_nulls().first())
    g = g.join(op, on="pg", how="left").sort("pg")
    first = behind.row(0, named=True) if behind.height else None
    pg = first["pg"] if first else g["pg"][0]
    gr = g.filter(pl.col("pg") == pg).row(0, named=True)
    at_ranks = _members([str(r) for r in timed.filter((pl.col("pg") == pg) & (pl.col("seq") == gr["at"]))["rank"].to_list()])
    where = ("a group the logs do not name" if pg == "?" else f"group {pg}")
    what = f"seq {gr['at']}" + (f" ({gr['op']})" if gr["op"] else "")
    if first is None and not silent:
        return {"verdict": "incomplete", "culprits": [],
                "reason": (f"PyTorch's watchdog: {_label(at_ranks)} timed out in {what} of {where}, none behind it: a hang "
                           "inside the collective (the network, a GPU), or a rank whose log is not in the inputs" + unseen)}
    late = behind.filter(pl.col("pg") == pg)
    culprits = _members([str(r) for r in late["rank"].to_list()] + [str(r) for r in silent])
    parts = [f"{_label(at_ranks)} timed out in {what} of {where}"]
    for r in late.head(8).iter_rows(named=True):
        parts.append(f"rank {r['rank']} " + (f"timed out at seq {r['seq']}" if r["seq"] is not None and r["seq"] < gr["at"] else
                                             f"had enqueued only up to seq {r['last_enqueued']}") + ": it never entered it")
    if silent:
        parts.append(f"{_label(_members([str(r) for r in silent]))} logged no timeout (likely never entered it: stuck before it, "
                     "outside NCCL, or dead)")
    return {"verdict": "hang", "culprits": culprits, "reason": "PyTorch's watchdog: " + "; ".join(parts) + unseen}
