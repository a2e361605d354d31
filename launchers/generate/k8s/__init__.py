"""Kubernetes manifests: the shared pod template and one module per target."""
