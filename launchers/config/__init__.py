"""job.yaml: the validated model, its sections, loading with line numbers, durations and the secret rule."""
