"""Ask for one value the trace does not give (the GPU or its peak, the model FLOPs per step): a
modal with a prompt and an input; the answer re-runs the analysis with that option."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class AskScreen(ModalScreen[str | None]):
    """Returns what the user typed (stripped), or None on escape or an empty answer."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    AskScreen { align: center middle; }
    AskScreen > Vertical { width: 80; max-width: 95%; height: auto; border: round $accent; background: $surface; padding: 1 2; }
    AskScreen Label { margin-bottom: 1; }
    """

    def __init__(self, prompt: str, current: str, placeholder: str, input_id: str):
        super().__init__()
        self.prompt, self.current, self.placeholder, self.input_id = prompt, current, placeholder, input_id

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"{self.prompt}  Enter re-runs the analysis; escape cancels.")
            yield Input(value=self.current, placeholder=self.placeholder, id=self.input_id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)


def gpu_screen(current: str | None) -> AskScreen:
    """The GPU the job ran on: a name in the peak table, or a number (the dense peak in TFLOP/s)."""
    return AskScreen("GPU the job ran on: a name from the peak table (H100, H200, A100, B200, MI300X, ...) "
                     "or the dense peak in TFLOP/s (e.g. 989).", current or "", "H100", "gpu-input")


def flops_screen(current: float | None) -> AskScreen:
    """The model FLOPs of one step on one GPU, when no shapes let tracelens count them."""
    return AskScreen("Model FLOPs of one training step on one GPU (rank), e.g. 6 x parameters x tokens per step "
                     "for a dense transformer: 4.2e15 or 4.2P.", f"{current:g}" if current else "", "4.2e15", "flops-input")
