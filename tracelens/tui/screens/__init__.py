"""Modal screens of the terminal UI (help)."""
