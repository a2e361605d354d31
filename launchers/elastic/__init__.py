"""The in-training side of graceful exit (imported by training scripts).

See the README's "Graceful exit" section for the API.
"""
