"""The node health check (issue 16): measure every node before training, name the stragglers and faulty ones.

``probes`` (compute, device memory, checkpoint directory), ``network`` (pairwise gloo link
rounds), ``verdict`` (the rules), ``report`` (table and health.json), ``across`` (one node's
part across real nodes), ``check`` (entry point; one node or a local simulation), ``outcome``
(shared types), ``gate`` (what the verdicts mean for training: ``health_check.on_failure``).
"""
