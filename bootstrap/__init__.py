"""Node bootstrap: what runs on a node before training starts.

sshd for the job with pinned host keys, the MPI hostfile, concurrent peer readiness checks
and the completion signal between nodes (the MPI engine's node roles).
"""
