"""Widgets of the terminal UI, one module per thing on screen."""
