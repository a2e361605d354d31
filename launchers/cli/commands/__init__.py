"""CLI commands beyond the core (``prestart``, ``entrypoint``, ``wheel``, ``manifest``, ``keys``...).

Each module here defines ``register(app: typer.Typer) -> None`` and adds its command(s).
Keep module-level imports to typer and the standard library: every ``mlaunch`` start
imports these modules, so heavy imports belong inside the command functions.
"""
