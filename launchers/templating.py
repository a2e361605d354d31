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

# Characters shellcheck reads as a mistake inside single quotes; they go in double quotes instead.
_SHELLCHECK_BAIT = re.compile("[$`\\\\\u2018\u2019]+")


def sh_quote(value: object) -> str:
    """Quote one value for POSIX shells (the ``sh`` filter): ``shlex.quote``'s single quotes, except
    that runs of ``$``, backticks, backslashes and Unicode single quotes go in double quotes (the
    first three backslash-escaped). Every shell reads the same word; shellcheck no longer takes a
    literal ``$(...)`` for an expansion meant to happen (SC2016), a backslash for an attempt to escape
    a quote (SC1003), a ``’`` for a mistyped quote (SC1112) or ``v==x`` for a typo (SC1097), so
    generated scripts pass it without exclusions whatever the values hold.
    """
    text = str(value)
    if not _SHELLCHECK_BAIT.search(text) and not text.startswith("="):
        return shlex.quote(text)
    quoted, pos = [], 0
    for match in _SHELLCHECK_BAIT.finditer(text):
        if match.start() > pos:
            quoted.append(_single_quoted(text[pos : match.start()]))
        quoted.append('"' + re.sub(r"([$`\\])", r"\\\1", match.group()) + '"')
        pos = match.end()
    if pos < len(text):
        quoted.append(_single_quoted(text[pos:]))
    return "".join(quoted)


def _single_quoted(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


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
