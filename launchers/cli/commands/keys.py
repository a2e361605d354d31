"""``mlaunch keys DIR``: create the ssh secret an MPI job shares across its nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def keys(
        directory: Annotated[Path, typer.Argument(help="directory to create the secret in", show_default=False)],
        force: Annotated[bool, typer.Option("--force", help="replace keys that already exist there")] = False,
    ) -> None:
        """Create the job's ssh secret: a client key and one job-wide host key (ed25519).

        Every node of an MPI job uses it: sshd accepts only this client key and presents this host key, which ssh checks strictly against a pinned known_hosts entry. Files are 0600 in a 0700 directory; an existing secret is kept unless --force. Keep it out of version control and share it as a secret:

          mlaunch keys ./job-ssh

          # job.yaml:  mpi: {keys_dir: ./job-ssh}

          # or mount it on every node and set MLAUNCH_SSH_KEYS to its path, e.g.

          kubectl create secret generic myjob-ssh --from-file=./job-ssh
        """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
        from bootstrap.keys import generate
        from launchers.errors import UserError

        try:
            written = generate(directory, force=force)
        except FileExistsError as exc:
            raise UserError(f"keys already exist ({exc}); pass --force to replace them") from None
        except OSError as exc:
            raise UserError(f"cannot write the job secret into {directory}: {exc.strerror or exc}") from None
        typer.echo(f"created the job's ssh secret in {directory}:")
        for path in written:
            typer.echo(f"  {path.name}")
        typer.echo(f"use it with `mpi: {{keys_dir: {directory}}}` in job.yaml, or mount it and set MLAUNCH_SSH_KEYS")
