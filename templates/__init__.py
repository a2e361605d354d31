"""Jinja2 templates shipped in the wheel (installed as ``launchers.templates``); see launchers/generate/render.py."""
