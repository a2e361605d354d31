"""What the platform tells this node: Cluster, appended args, detection per source, TF specs, rank tables."""
