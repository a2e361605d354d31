"""The command line: the fast run path (main), the typer application, its commands, check and the plan view."""
