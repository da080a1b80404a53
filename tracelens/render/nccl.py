"""What every front end shows of NCCL's records (``job.nccl_diagnosis``, ``job.nccl``): the
collective timeline's states (letters as ``tracelens.analysis.job.hang.STATE_LETTERS`` writes
them, names, colours), the verdict's headline and the bandwidth table's columns; the HTML
section and the TUI view draw from these, so both say the same."""

from __future__ import annotations

from typing import Any

# the timeline's cell letter -> (state, colour, what it means)
STATES: dict[str, tuple[str, str, str]] = {
    "C": ("completed", "#26a269", "completed"),
    "S": ("started", "#e5a50a", "started, never completed"),
    "Q": ("scheduled", "#1c71d8", "scheduled (enqueued; an NCCL log line is one)"),
    "?": ("other", "#9141ac", "another state"),
    ".": ("missing", "#c0bfbc", "no record: never entered, or not in the inputs"),
}
DIVERGENCE = {"mismatch": "first mismatch", "not_entered": "first seq not entered by all", "not_completed": "first seq not completed"}
VERDICT_TITLES = {"ok": "consistent", "mismatch": "MISMATCH", "hang": "HANG", "incomplete": "STUCK",
                  "incomplete_inputs": "INCOMPLETE INPUTS", "no_collectives": "no collectives"}
BANDWIDTH_COLUMNS = ("path", "test", "collective", "nranks", "bytes", "count", "dtype", "redop", "root", "in_place",
                     "time_us", "algbw_gbps", "busbw_gbps", "wrong")
BANDWIDTH_SHOWN = 500  # rows of the bandwidth table shown (all in the JSON)


def diagnosis(d: dict[str, Any]) -> dict[str, Any] | None:
    return (d.get("job") or {}).get("nccl_diagnosis") or None


def nccl_only(d: dict[str, Any]) -> bool:
    """A report of NCCL records alone (no profiled rank)."""
    return (d.get("job") or {}).get("nccl") is not None and not d.get("ranks")


def state_of(letter: str) -> str:
    return STATES.get(letter, STATES["?"])[0]


def member_label(m: Any) -> str:
    return f"rank {m}" if isinstance(m, int) else str(m)


def group_title(g: dict[str, Any]) -> str:
    desc = f" ({g['group_desc']})" if g.get("group_desc") else ""
    shown = len(g["members"])
    more = f", {shown} of {g['members_total']} members shown" if g["members_total"] > shown else ""
    return (f"group {g['group']}{desc}: {g['members_total']} member(s){' of ' + str(g['size']) if g.get('size') else ''}{more}, "
            f"seq {g['seq_from']}..{g['seq_to']} of {g['seq_first']}..{g['seq_last']}")


def frame_text(fr: dict[str, Any]) -> str:
    return f"{fr.get('name')} at {fr.get('filename')}:{fr.get('line')}"


def bandwidth(d: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``job.nccl.bandwidth`` when the report has it (nccl-tests, Inspector), else None."""
    rows = ((d.get("job") or {}).get("nccl") or {}).get("bandwidth")
    return rows if isinstance(rows, list) else None


def behind_text(behind: list[dict[str, Any]], limit: int) -> str:
    """A group's members behind (``groups[].behind``): "2 (at seq 4)", or "1 (no record of the group)"
    for a member whose dump holds none of its calls."""
    return ", ".join(f"{b['member']} (at seq {b['last_seq']})" if b.get("last_seq") is not None
                     else f"{b['member']} (no record of the group)" for b in behind[:limit])
