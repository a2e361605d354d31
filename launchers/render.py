"""Jinja2 rendering for generated files (pre-start script, entrypoint, manifests, hostfile).

Every value that reaches a shell goes through the ``sh`` filter (``shlex.quote``);
templates never mark user data ``|safe``. Templates ship in the wheel as
``launchers.templates`` and are found with importlib.resources, so an installed wheel
renders exactly what a checkout does.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from typing import Any

import jinja2


def sh_quote(value: object) -> str:
    """Quote one value for POSIX shells (the ``sh`` filter): ``shlex.quote``, with ``$`` and backticks
    escaped outside the single quotes. Every shell reads the same word; shellcheck no longer takes a
    literal ``$(...)`` or ``$HOME`` in a value for an expansion that was meant to happen (SC2016), so
    generated scripts pass it without exclusions whatever the values hold.
    """
    text = str(value)
    if "$" not in text and "`" not in text:
        return shlex.quote(text)
    return "".join(
        "\\" + part if part in ("$", "`") else shlex.quote(part) for part in re.split(r"([$`])", text) if part
    )


def sh_join(values: object) -> str:
    """Quote and join a list of arguments (the ``sh_join`` filter)."""
    if isinstance(values, (str, bytes)):
        raise TypeError("sh_join expects a list of arguments, not a string")
    return " ".join(sh_quote(v) for v in values)  # type: ignore[attr-defined]


class _PackageLoader(jinja2.BaseLoader):
    """Load templates through importlib.resources (works for editable installs and wheels)."""

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        ref = resources.files("launchers.templates").joinpath(template)
        if not ref.is_file():
            raise jinja2.TemplateNotFound(template)
        return ref.read_text(encoding="utf-8"), str(ref), lambda: True


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=_PackageLoader(),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["sh"] = sh_quote
    env.filters["sh_join"] = sh_join
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def template_names() -> list[str]:
    root = resources.files("launchers.templates")
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".j2"))
