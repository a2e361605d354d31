"""What a check reports: one finding per fact, with a level that decides the exit code.

Shared by ``mlaunch check`` (which prints them) and the parts that contribute checks of their
own (the grace budget, high availability, the MPI engine), so none of them imports the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class Finding:
    level: Literal["ok", "note", "warning", "error"]
    message: str
