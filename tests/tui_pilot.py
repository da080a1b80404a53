"""What the TUI's Pilot tests share: waiting for the app to settle, the key that opens a view,
and leaving the timeline back to the view that jumped there."""

from __future__ import annotations

from tracelens.tui.panes import VIEWS


async def settle(app, pilot) -> None:
    """Until the app's workers are done and three refreshes have run."""
    await app.workers.wait_for_complete()
    for _ in range(3):
        await pilot.pause()


def view_key(pane_id: str) -> str:
    """The digit that opens the view ``pane_id`` (VIEWS' order: 1-9, then 0 for the tenth)."""
    return str((1 + next(i for i, (pid, _, _) in enumerate(VIEWS) if pid == pane_id)) % 10)


async def back_to(app, pilot, tab: str) -> None:
    """Escape from the timeline returns to the view ``tab`` that jumped there."""
    await pilot.press("escape")
    await pilot.pause()
    assert app.query_one("#tabs").active == tab


async def open_view(app, pilot, key: str) -> None:
    """The app settled, the view's key pressed, settled again (the view built and laid out)."""
    await settle(app, pilot)
    await pilot.press(key)
    await settle(app, pilot)
