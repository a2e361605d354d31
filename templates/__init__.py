"""Jinja2 templates shipped in the wheel (installed as ``launchers.templates``); see launchers/templating.py."""
