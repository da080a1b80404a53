"""Ask for the model FLOPs per step when the trace has no shapes to count them from (no
record_shapes, custom or compiled ops): the answer re-runs the analysis, as --model-flops-per-step."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class FlopsScreen(ModalScreen[str | None]):
    """Returns what the user typed (FLOPs per step and rank, e.g. 4.2e15 or 4.2P), or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    FlopsScreen { align: center middle; }
    FlopsScreen > Vertical { width: 80; max-width: 95%; height: auto; border: round $accent; background: $surface; padding: 1 2; }
    FlopsScreen Label { margin-bottom: 1; }
    """

    def __init__(self, current: float | None):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Model FLOPs of one training step on one GPU (rank), e.g. 6 x parameters x tokens per step "
                        "for a dense transformer: 4.2e15 or 4.2P.  Enter re-runs the analysis; escape cancels.")
            yield Input(value=f"{self.current:g}" if self.current else "", placeholder="4.2e15", id="flops-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)
