"""Sweep specs and API bodies as plain Python values, read safely.

`load_yaml` and `load_json` refuse what a spec never needs and an attacker could use: aliases (a small
file expanding into a huge spec), duplicate keys (YAML silently keeps the last), tags beyond plain data,
nesting beyond MAX_DEPTH, text that is not UTF-8, integers longer than the interpreter converts. Every
refusal is a SpecError naming the line (YAML) or the problem (tests/badinput).
"""

from __future__ import annotations

import json
import sys
import typing
from typing import Any

import yaml

from service.errors import SpecError

MAX_DEPTH = 20
SHOWN_CHARS = 200


def show(value: Any) -> str:
    """repr() of a value for an error message, cut to SHOWN_CHARS: a hostile value can be 256 KiB long."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


# Tags of plain data (the YAML 1.2 core schema, which is JSON's types). !!binary, !!set, !!omap,
# !!timestamp and the like would hand the validators bytes, sets or datetimes no task config expects.
CORE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}


class _NoAliasLoader(yaml.SafeLoader):
    """A safe loader for plain data: no anchors/aliases (they can expand a small file into a huge
    spec), no nesting beyond MAX_DEPTH, no duplicate keys (YAML would silently keep the last one),
    no tags beyond the core schema, and dates stay strings."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.YAMLError(f"YAML aliases (*{event.anchor}) are not allowed in a sweep spec; write values out")
        if self.depth > MAX_DEPTH:
            raise yaml.YAMLError(f"the document nests deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        if node.tag not in CORE_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(
                None, None, f"the tag {tag} is not allowed in a sweep spec; write plain values", node.start_mark
            )
        return super().construct_object(node, deep)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {show(key)} appears twice in one mapping (first at line {seen[key].line + 1}); keep one",
                    key_node.start_mark,
                )
            if isinstance(key, typing.Hashable):
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.depth = 0


# Drop the implicit timestamp type: `2024-01-02` stays the string it reads as (as in JSON and YAML 1.2).
_NoAliasLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([f"<document>: not UTF-8 text (byte {exc.start}); save the file as UTF-8"]) from None


def load_yaml(text: str | bytes) -> Any:
    if isinstance(text, bytes):
        text = _utf8(text)
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(exc, yaml.reader.ReaderError):  # a control character: no mark, only an offset
            line = text.count("\n", 0, exc.position) + 1
            where = f" at line {line}, column {exc.position - text.rfind(chr(10), 0, exc.position)}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, yaml.reader.ReaderError):
            char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
            problem = f"the character {char} is not allowed ({exc.reason}); remove it or quote it as an escape"
        raise SpecError([f"<document>: not valid YAML{where}: {' '.join(problem.split())}"]) from None
    except ValueError as exc:  # an integer of more than 4300 digits (int() refuses it: CVE-2020-10735)
        raise SpecError([f"<document>: not valid YAML: {_too_long_number(exc)}"]) from None


def load_json(body: bytes) -> Any:
    """Parse a JSON body with the YAML loader's limits: no duplicate keys, no nesting beyond MAX_DEPTH.
    NaN and Infinity parse (as Python's json does) and are then rejected naming their field."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"the key {show(key)} appears twice in one object; keep one")
            out[key] = value
        return out

    text = _utf8(body)  # not json.loads(bytes): it would take UTF-16 and UTF-32 as well
    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise SpecError([f"<document>: not valid JSON: {exc}"]) from None
    except RecursionError:
        raise SpecError([f"<document>: not valid JSON: the document nests deeper than {MAX_DEPTH} levels"]) from None
    except ValueError as exc:  # a duplicate key, or an integer of more than 4300 digits
        raise SpecError([f"<document>: not valid JSON: {_too_long_number(exc)}"]) from None
    if _depth(data) > MAX_DEPTH + 1:  # the YAML loader counts the top mapping as level 0
        raise SpecError([f"<document>: not valid JSON: the document nests deeper than {MAX_DEPTH} levels"])
    return data


def _too_long_number(exc: ValueError) -> str:
    text = str(exc)
    if "integer string conversion" in text:  # the interpreter's advice (set_int_max_str_digits) is not the user's
        return f"a number has more than {sys.get_int_max_str_digits()} digits; no task parameter needs that many"
    return text


def _depth(value: Any) -> int:
    """Nesting depth of lists and objects, without recursion (a hostile document may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, level + 1) for v in node)
    return deepest
