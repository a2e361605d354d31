"""mlaunch's MPI example: an mpi4py allreduce that checks its own answer.

Every rank contributes ``rank + 1``; the sum over W ranks must be W(W+1)/2. Rank 0 prints
``allreduce-sum <sum> world <W>`` and each rank prints where it ran, so a run across hosts
shows which host every rank landed on.

    mlaunch --engine mpi examples/mpi/job.yaml          # 2 nodes × 2 slots, simulated on this machine
"""

from __future__ import annotations

import socket
import sys

from mpi4py import MPI


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    print(f"rank {rank} of {world} on {socket.gethostname()}", flush=True)
    expected = world * (world + 1) // 2
    if total != expected:
        print(f"rank {rank}: allreduce gave {total}, expected {expected}", file=sys.stderr, flush=True)
        return 1
    comm.Barrier()
    if rank == 0:
        print(f"allreduce-sum {total} world {world}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
