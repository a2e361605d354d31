"""Kubernetes manifests: the registry (``manifests``), one module per target, the shared pod and parts."""
