"""The help screen: every key, in one place."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# tracelens — keys

| key | where | what |
|---|---|---|
| `1`..`8` | anywhere | Overview, Ranks, Steps, Kernels, Communication, Suggestions, Timeline, Warnings |
| `n` | anywhere | the NCCL view (NCCL logs / Flight Recorder dumps: the hang or mismatch verdict, each group's collective timeline), where the report has one |
| `tab` / `shift+tab` | anywhere | move the focus |
| `enter` | a table | open the row: a rank → its steps → the step's timeline; a suggestion → its evidence in the timeline; a slow collective → its time in the timeline; a kernel → its longest launch |
| `escape` | anywhere | back to where you came from (or close the filter) |
| `/` | a table | filter its rows (substring, any column) |
| `s` | a table | sort by the column under the cursor (again: reverse); or click a header |
| `←` `→` | timeline | move the cursor (the status line names the kernel under it) |
| `↑` `↓` | timeline | select a stream (mouse wheel scrolls) |
| `w` `+` / `s` `-` | timeline | zoom in / out around the cursor (ctrl+wheel too) |
| `a` / `d` | timeline | pan left / right |
| `[` / `]` | timeline | previous / next step of the selected rank |
| `z` / `0` | timeline | zoom to the step under the cursor / to the whole trace |
| `g` | timeline | one "GPU" row per rank (the union of its streams) / every stream again |
| `p` | overview | show or hide the parts of each waterfall bar |
| `G` | anywhere | set the GPU (a name or its dense peak in TFLOP/s) when the trace does not say: the analysis runs again |
| `F` | anywhere | enter the model FLOPs per step (e.g. 4.2e15 or 4.2P) when the trace has no shapes to count them from: the analysis runs again |
| `C` | anywhere | compute each step's critical path (and its what-if replays) when the report has none: the analysis runs again |
| `enter` | critical path | the step in the timeline, its whole path traced and highlighted on the streams it runs on (the status line names the path's event at the cursor) |
| `?` | anywhere | this help |
| `q` | anywhere | quit |

**The waterfall** starts at 100% of the GPU's dense peak and removes, bar by bar, the GPU time
lost to each cause (idle time split by what the host was doing, exposed communication and
copies, recompute, non-matmul kernels, matmuls below peak, the FLOP-convention difference)
down to the MFU.  Bars are disjoint slices of GPU time, so they sum to 100%.  When the GPU or
the FLOPs are unknown, the chart shows the GPU-time waterfall (the same idle, communication and
copy bars) and ends at the compute share, whose FLOP efficiency is unknown; the overview says
what is missing and which key supplies it.
Matmul kernels no op with counted FLOPs launched (compiled code, custom attention) are their own
part of "matmul below peak", and the MFU is then marked a lower bound.  The bar before the MFU
bridges each matmul's own dtype peak and the 16-bit peak the MFU uses; it is named for what it
holds (e.g. "FP32 math instead of tensor cores").  "% peak" is always of the dtype a kernel ran
at; a share above 100% cannot be and shows as ⚠ >100% (its FLOPs or dtype are wrong).

**Warnings** (`8`) lists everything the analysis could not measure, left out or flagged, one
row each; the overview counts them.

**The timeline** draws one line per GPU stream: a cell's height is how busy the stream was in
that slice of time, its colour the kernel class that took most of it (blue GEMM/conv, purple
attention, red communication, yellow copies, green norms/elementwise, orange optimizer).
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 95%; height: 90%; border: round $accent; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)
