"""The one rule for which environment names carry credentials.

Every place that decides whether a value may be written, echoed or forwarded asks this
module: job.yaml validation (``prestart.export``, ``mpi.export``), the generated pre-start,
and the MPI head that forwards env to ranks with ``mpirun -x``. One rule means a name that
is kept out of a generated script is also kept out of mpirun's command line.
"""

from __future__ import annotations

import fnmatch

# Generic credential words, then the cloud-credential families ModelArts' own scripts copied
# blindly to every rank (S3/OBS/AWS keys, AK/SK pairs, session tokens).
SECRET_NAME_PATTERNS = (
    "*_KEY",
    "*SECRET*",
    "*TOKEN*",
    "CRED*",
    "*CREDENTIAL*",
    "*PASSWORD*",
    "*PASSWD*",
    "S3_*",
    "SCC*",
    "AWS_*",
    "OBS_*",
    "*_AK",
    "*_SK",
    "AK",
    "SK",
    "*PRIVATE*",
    "*AUTH*",
    "*SESSION*",
)


def looks_secret(name: str) -> bool:
    """Whether an env variable name looks like it carries a credential (case-insensitive)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_NAME_PATTERNS)
