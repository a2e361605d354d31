"""A strict, bounded YAML loader for job.yaml: YAML 1.2 core schema, one pass, limits enforced.

What PyYAML's ``SafeLoader`` does and this loader does not (YAML 1.1 habits that surprise):
``yes/no/on/off`` are strings, not booleans; ``2:3`` is a string, not sexagesimal 123; ``010``
is ten, not eight; ``2024-01-01`` is a string, not a date; ``<<`` merge keys are plain keys.
Refused, each with the line: tags other than the core ones (``!!set``, ``!!binary``, ``!x``),
a key given twice (both lines named), nesting deeper than ``MAX_YAML_DEPTH``, more than
``MAX_YAML_NODES`` values once aliases are expanded, a number literal longer than
``MAX_NUMBER_CHARS`` characters, a lone surrogate (``"\\ud800"``) in a string, a core tag on a
value it does not fit (``!!bool ''`` once read as false; now the key is named).

The document is composed once (libyaml's parser when present) and constructed from that
node tree; the tree is returned too, so error messages can name lines without a second parse.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

from launchers.config.limits import MAX_NUMBER_CHARS, MAX_YAML_DEPTH, MAX_YAML_NODES

try:  # libyaml's parser: the same events, several times faster
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


_T = "tag:yaml.org,2002:"
CORE_TAGS = frozenset(_T + name for name in ("str", "int", "float", "bool", "null", "seq", "map"))
_SURROGATE = re.compile("[\ud800-\udfff]")


class StrictYAMLError(yaml.MarkedYAMLError):
    """A document this loader refuses; ``problem`` says why, ``problem_mark`` where."""


class CoreResolver(BaseResolver):
    """YAML 1.2 core schema: null, true/false, decimal/0o/0x integers, floats, .inf/.nan."""


_FORMS: dict[str, re.Pattern[str]] = {}  # core tag → the scalars it takes (an explicit tag must fit too)
for _tag, _pattern, _first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+.0123456789",
    ),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
):
    _FORMS[_tag] = re.compile(_pattern)
    CoreResolver.add_implicit_resolver(_T + _tag, _FORMS[_tag], list(_first))
_MEANING = {"bool": "true or false", "int": "a whole number", "float": "a number", "null": "null (or ~)"}


class TagMismatch(StrictYAMLError):
    """An explicit core tag on a scalar it does not fit (``!!bool ''``); ``node`` is the value, for its key."""

    def __init__(self, node: Node, kind: str) -> None:
        shown = node.value if len(node.value) <= 40 else node.value[:40] + "..."
        super().__init__(None, None, f"{shown!r} is not {_MEANING[kind]} (it is tagged !!{kind})", node.start_mark)
        self.node = node


class CoreConstructor(SafeConstructor):
    """Core-schema scalars, with number literals bounded in length."""

    def _number_text(self, node: Node, kind: str) -> str:
        value = str(self.construct_scalar(node))  # type: ignore[arg-type]
        if len(value) > MAX_NUMBER_CHARS:
            raise StrictYAMLError(
                None, None, f"a number of {len(value)} characters (at most {MAX_NUMBER_CHARS})", node.start_mark
            )
        if not _FORMS[kind].match(value) and not (kind == "float" and _FORMS["int"].match(value)):
            raise TagMismatch(node, kind)  # only an explicit tag gets here: the resolver matched the others
        return value

    def construct_core_int(self, node: Node) -> int:
        text = self._number_text(node, "int")
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)

    def construct_core_float(self, node: Node) -> float:
        text = self._number_text(node, "float").lower()
        if text.endswith(".nan"):
            return float("nan")
        if text.endswith(".inf"):
            return float("-inf") if text.startswith("-") else float("inf")
        return float(text)

    def construct_core_bool(self, node: Node) -> bool:
        value = str(self.construct_scalar(node))  # type: ignore[arg-type]
        if not _FORMS["bool"].match(value):
            raise TagMismatch(node, "bool")
        return value.lower() == "true"

    def construct_core_null(self, node: Node) -> None:
        if not _FORMS["null"].match(str(self.construct_scalar(node))):  # type: ignore[arg-type]
            raise TagMismatch(node, "null")
        return None


CoreConstructor.yaml_constructors = {
    _T + "null": CoreConstructor.construct_core_null,
    _T + "bool": CoreConstructor.construct_core_bool,
    _T + "int": CoreConstructor.construct_core_int,
    _T + "float": CoreConstructor.construct_core_float,
    _T + "str": SafeConstructor.construct_yaml_str,
    _T + "seq": SafeConstructor.construct_yaml_seq,
    _T + "map": SafeConstructor.construct_yaml_map,
}


class BoundedComposer(Composer):
    """PyYAML's composer, counting depth and (alias-expanded) size, refusing odd tags and duplicate keys."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        depth = self._depth = getattr(self, "_depth", 0) + 1
        self._composed = getattr(self, "_composed", 0) + 1  # counted as read: a long list stops early
        try:
            if self._composed > MAX_YAML_NODES:
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise StrictYAMLError(None, None, f"more than {MAX_YAML_NODES:,} values", mark)
            if depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise StrictYAMLError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth = depth - 1
        if node is not None:
            self._check(node)
        return node

    def _check(self, node: Node) -> None:
        sizes: dict[int, int] = self.__dict__.setdefault("_sizes", {})
        if node.tag not in CORE_TAGS:
            raise StrictYAMLError(
                None,
                None,
                f"the tag {node.tag!r} is not allowed (plain YAML values only: strings, numbers, "
                "true/false, null, lists, mappings)",
                node.start_mark,
            )
        if isinstance(node, ScalarNode):
            size = 1
            if _SURROGATE.search(node.value):
                raise StrictYAMLError(None, None, "a string with a lone surrogate (not valid Unicode)", node.start_mark)
        elif isinstance(node, SequenceNode):
            size = 1 + sum(sizes.get(id(child), 1) for child in node.value)
        else:
            assert isinstance(node, MappingNode)
            size = 1 + sum(sizes.get(id(k), 1) + sizes.get(id(v), 1) for k, v in node.value)
            _no_duplicate_keys(node)
        if size > MAX_YAML_NODES:
            raise StrictYAMLError(
                None, None, f"more than {MAX_YAML_NODES:,} values (aliases expanded)", node.start_mark
            )
        sizes[id(node)] = size
        self._last_mark = node.start_mark


def _no_duplicate_keys(node: MappingNode) -> None:
    seen: dict[tuple[str, str], Node] = {}
    for key, _ in node.value:
        if not isinstance(key, ScalarNode):
            continue
        ident = (key.tag, key.value)
        if ident in seen:
            first = seen[ident]
            raise StrictYAMLError(
                f"the key {key.value!r} is first given on line {first.start_mark.line + 1}",
                first.start_mark,
                f"the key {key.value!r} is given twice (lines {first.start_mark.line + 1} and "
                f"{key.start_mark.line + 1}); keep one",
                key.start_mark,
            )
        seen[ident] = key


class StrictLoader(BoundedComposer, _Parser, CoreConstructor, CoreResolver):
    """job.yaml's loader: libyaml events (when available), the bounded composer, core-schema values."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        CoreConstructor.__init__(self)
        CoreResolver.__init__(self)
        self._last_mark: Any = None

    # CParser brings its own node methods; the composer's (bounded) ones must win.
    check_node = Composer.check_node
    get_node = Composer.get_node
    get_single_node = Composer.get_single_node


def load_strict(text: str) -> tuple[Any, Node | None]:
    """(data, node tree) of one YAML document; every refusal is a ``yaml.YAMLError`` with a position.

    Anything else raised while building values (there should be nothing) becomes a
    ``StrictYAMLError`` at the last node read, so no input ends in a traceback.
    """
    loader = StrictLoader(text)
    node = None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
        return data, node
    except TagMismatch as exc:
        path = _key_path(node, exc.node)
        if path:
            exc.problem = f"key '{path}': {exc.problem}"
        raise
    except yaml.YAMLError:
        raise
    except Exception as exc:  # noqa: BLE001 - the promise is "no traceback for any input"
        raise StrictYAMLError(
            None, None, f"cannot read a value ({type(exc).__name__}: {exc})", loader._last_mark
        ) from None
    finally:
        loader.dispose()


def _key_path(root: Node | None, target: Node) -> str | None:
    """The dotted key path (``tensorflow.chief``, ``args[2]``) of ``target`` in the tree, for a message."""
    stack: list[tuple[Node, str]] = [(root, "")] if root is not None else []
    seen = 0
    while stack and seen <= MAX_YAML_NODES:
        node, path = stack.pop()
        seen += 1
        if node is target:
            return path or None
        if isinstance(node, MappingNode):
            stack.extend((value, f"{path}.{key.value}" if path else str(key.value)) for key, value in node.value)
        elif isinstance(node, SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return None
