"""The documentation's generated pages and tables: the job.yaml reference (from the JSON Schema), the CLI
reference, and the control plane's message table (from ``launchers/control/messages.py``).

Used as an MkDocs hook (``mkdocs.yml``: ``hooks: [docs/gen/reference.py]``): ``on_files`` adds
``reference/job-yaml.md`` and ``reference/cli.md`` to the site at build time, generated from
``launchers.config.job_json_schema()`` (what ``mlaunch schema`` prints) and from the typer
application itself. Generated at build time rather than committed, so they cannot go stale:
a new key or option is in the next build, and ``mkdocs build --strict`` (a test, and CI) fails
if a page links to something the generation no longer makes. ``tests/test_docs.py`` also
checks that every key of the model and every command appears.

The message table sits inside a hand-written page: ``docs/control-plane.md`` holds the marker
``MESSAGES_MARKER`` where ``on_page_markdown`` puts the table, so the protocol's one definition
is also its documentation (every kind, its fields, who says it, when, what it costs).
"""

from __future__ import annotations

import json
import re
from typing import Any

JOB_YAML_PAGE = "reference/job-yaml.md"
CLI_PAGE = "reference/cli.md"
MESSAGES_PAGE = "control-plane.md"
MESSAGES_MARKER = "<!-- the message table: generated from launchers/control/messages.py -->"


# -- job.yaml ------------------------------------------------------------------------------------
def job_yaml_markdown(schema: dict[str, Any]) -> str:
    """The reference page: the top-level keys, then one table per section, in the model's order."""
    defs = schema.get("$defs", {})
    lines = [
        "# job.yaml reference",
        "",
        "Generated from the JSON Schema that `mlaunch schema` prints (the model's own descriptions, types,",
        "defaults and ranges), so it always matches the installed mlaunch. Unknown keys are errors with a",
        '"did you mean" hint. For what the keys do together, see [job.yaml](../job-yaml.md).',
        "",
        "## Top-level keys",
        "",
        *_table(schema, defs, ""),
    ]
    for name, prop in schema.get("properties", {}).items():
        section = _section(prop, defs)
        if section is None:
            continue
        lines += ["", f"## `{name}:`", ""]
        if section.get("description"):
            lines += [_clean(section["description"]), ""]
        lines += _table(section, defs, f"{name}.")
        for sub_name, sub_prop in section.get("properties", {}).items():
            nested = _section(sub_prop, defs)
            if nested is not None:
                lines += ["", f"### `{name}.{sub_name}:`", "", *_table(nested, defs, f"{name}.{sub_name}.")]
    return "\n".join(lines) + "\n"


def _section(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a property refers to (a section such as ``checkpoint:``), or None for a value."""
    for candidate in [prop, *prop.get("anyOf", [])]:
        ref = candidate.get("$ref")
        if ref and ref.rsplit("/", 1)[-1] in defs:
            target = defs[ref.rsplit("/", 1)[-1]]
            if target.get("type") == "object" and target.get("properties"):
                return dict(target)
    return None


def _table(schema: dict[str, Any], defs: dict[str, Any], prefix: str) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        if _section(prop, defs) is not None and not prefix:
            kind = f"section ([below](#{name}))"
        elif _section(prop, defs) is not None:
            kind = "section"
        else:
            kind = _type(prop)
        default = "**required**" if name in required else _default(prop)
        rows.append(f"| `{prefix}{name}` | {kind} | {default} | {_cell(prop.get('description', ''))} |")
    return rows


def _type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "anyOf" in prop:
        kinds = [_type(p) for p in prop["anyOf"]]
        if any("duration" in k for k in kinds) or _is_duration(prop):
            kinds = ["duration"] + [k for k in kinds if k == "null"]
        return " or ".join(dict.fromkeys(kinds))
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object":
        extra = prop.get("additionalProperties")
        return f"map of {_type(extra)}" if isinstance(extra, dict) else "map"
    if kind in ("integer", "number") and ("minimum" in prop or "maximum" in prop):
        return f"{kind} {prop.get('minimum', '')}..{prop.get('maximum', '')}"
    if kind == "string" and "pattern" in prop and "[sSmMhHdD]" in prop["pattern"]:
        return "duration"
    return str(kind)


def _is_duration(prop: dict[str, Any]) -> bool:
    return "duration" in str(prop.get("description", "")) or "[sSmMhHdD]" in json.dumps(prop)


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    return f"`{json.dumps(prop['default'], ensure_ascii=False)}`"


def _clean(text: str) -> str:
    return text.replace("``", "`")


def _cell(text: str) -> str:
    """Text for a table cell or a paragraph: ``<code_dir>`` is text, not an HTML tag."""
    parts = _clean(text).split("`")  # odd parts are code spans: Markdown shows them as they are
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|").replace("\n", " ")


# -- the CLI ---------------------------------------------------------------------------------------
def cli_markdown(group: Any) -> str:
    """One section per command of the click group typer builds: usage, help text, arguments and options."""
    import click

    lines = [
        "# Command-line reference",
        "",
        "Generated from the `mlaunch` command itself (the same text `mlaunch COMMAND --help` prints).",
        "`mlaunch job.yaml` is `mlaunch run job.yaml`. Exit codes: 0 success; the failing rank's own code",
        "when training fails (128+N if it died of signal N); 128+N when mlaunch itself was stopped by",
        "signal N; 2 for a user error (bad job.yaml, bad platform env), with a message and no traceback.",
    ]
    ctx = click.Context(group, info_name="mlaunch")
    for name in sorted(group.commands):
        command = group.commands[name]
        sub = click.Context(command, info_name=f"mlaunch {name}", parent=ctx)
        usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), " ".join(command.collect_usage_pieces(sub)))
        lines += ["", f"## `mlaunch {name}`", "", "```text", f"mlaunch {name} {usage}".rstrip(), "```", ""]
        help_text = (command.help or "").strip()
        if help_text:
            paragraphs = help_text.split("\n\n")
            lines += [_cell(paragraphs[0]), ""]
            rest = [p for p in paragraphs[1:] if p.strip()]
            if rest:
                lines += ["```text", *("\n".join(part.strip() for part in p.splitlines()) for p in rest), "```", ""]
        params = [p for p in command.params if getattr(p, "help", None) is not None or isinstance(p, click.Argument)]
        if params:
            lines += ["| argument / option | help | default |", "|---|---|---|"]
            for param in params:
                names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
                shown = param.default if param.default not in (None, False, ()) else ""
                default = f"`{shown}`" if shown != "" and not callable(shown) else ""
                lines.append(f"| {names} | {_cell(getattr(param, 'help', '') or '')} | {default} |")
    return "\n".join(lines) + "\n"


def mlaunch_group() -> Any:
    import typer

    from launchers.cli.app import app

    return typer.main.get_command(app)


# -- the control plane's messages ------------------------------------------------------------------------
def messages_markdown() -> str:
    """One row per message kind and sender, in the protocol's order: the agents' words, then the hub's."""
    from launchers.control import messages

    lines = [
        "| from → to | message | fields | when | size | kept until sent |",
        "|---|---|---|---|---|---|",
    ]
    for sender, to in ((messages.AGENT, "agent → hub"), (messages.HUB, "hub → agents")):
        for cls in messages.ALL:
            if sender not in cls.SENDERS:
                continue
            fields = ", ".join(f"`{name}`" for name in messages.field_names(cls))
            reliable = "yes" if cls.RELIABLE and sender == messages.AGENT else ""
            lines.append(f"| {to} | `{cls.KIND}` | {fields} | {_cell(cls.WHEN)} | {cls.SIZE} | {reliable} |")
    return "\n".join(lines)


# -- the MkDocs hook ---------------------------------------------------------------------------------
def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (MkDocs ≥ 1.6: ``File.generated``)."""
    from mkdocs.structure.files import File

    from launchers.config.job import job_json_schema

    files.append(File.generated(config, JOB_YAML_PAGE, content=job_yaml_markdown(job_json_schema())))
    files.append(File.generated(config, CLI_PAGE, content=cli_markdown(mlaunch_group())))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The control plane's page: its message table from the protocol's definition."""
    if page.file.src_uri == MESSAGES_PAGE:
        if MESSAGES_MARKER not in markdown:
            raise ValueError(f"{MESSAGES_PAGE} lost its marker {MESSAGES_MARKER!r}")
        markdown = markdown.replace(MESSAGES_MARKER, messages_markdown())
    return markdown
