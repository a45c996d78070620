"""The `tuneharness` command line (typer + rich). Heavy imports happen inside commands."""
