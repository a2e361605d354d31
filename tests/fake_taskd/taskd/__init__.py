"""FAKE TaskD for mlaunch's tests: records calls (see tests/fake_taskd/README.md)."""
