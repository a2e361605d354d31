"""The node health check (issue 16): measure every node before training, name the stragglers and faulty ones.

``probes`` (compute, device memory, checkpoint directory), ``network`` (pairwise gloo link
rounds), ``verdict`` (the rules), ``report`` (table and health.json), ``check`` (running it
across the job), ``gate`` (what the verdicts mean for training: ``health_check.on_failure``).
"""
