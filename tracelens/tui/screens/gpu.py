"""Ask for the GPU (or its peak) when the trace does not say: the answer re-runs the analysis."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class GpuScreen(ModalScreen[str | None]):
    """Returns what the user typed (a GPU name, or a number: the dense peak in TFLOP/s), or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    GpuScreen { align: center middle; }
    GpuScreen > Vertical { width: 80; max-width: 95%; height: auto; border: round $accent; background: $surface; padding: 1 2; }
    GpuScreen Label { margin-bottom: 1; }
    """

    def __init__(self, current: str | None):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("GPU the job ran on: a name from the peak table (H100, H200, A100, B200, MI300X, ...) "
                        "or the dense peak in TFLOP/s (e.g. 989).  Enter re-runs the analysis; escape cancels.")
            yield Input(value=self.current or "", placeholder="H100", id="gpu-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)
