"""The one YAML loader of recipes and wheelforge.yaml: safe, strict and bounded.

On top of ``yaml.safe_load`` (no python tags):

* the file must be UTF-8; otherwise the error names the byte offset;
* a key given twice in one mapping is an error naming both lines (YAML says keys are
  unique; PyYAML silently keeps the last);
* anchors and aliases (``&x`` / ``*x``) are refused: a recipe is a few dozen lines that
  gain nothing from them, and an alias bomb (a few hundred bytes that expand to
  billions of nodes) must fail at once, not after minutes and a MemoryError;
* nesting is bounded (:data:`MAX_DEPTH`), so a deeply nested document is an error,
  not a RecursionError; so is the file's size (:data:`MAX_BYTES`).

Every problem is a :class:`YamlProblem` with the 1-based line (and column); callers turn
it into their own error class (RecipeError, ConfigError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node

from .errors import WheelforgeError

#: The deepest nesting of mappings and sequences accepted (recipes need 4).
MAX_DEPTH = 32
#: The largest file accepted: recipes and wheelforge.yaml are a few KiB.
MAX_BYTES = 1 << 20


class YamlProblem(Exception):
    """A document wheelforge refuses; ``str()`` says where and why."""


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlProblem(f"{_where(event.start_mark)}: alias *{event.anchor} is not "
                              "allowed (wheelforge refuses YAML anchors and aliases; write "
                              "the value out)")
        event = self.peek_event()  # type: ignore[no-untyped-call]
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise YamlProblem(f"{_where(event.start_mark)}: anchor &{anchor} is not allowed "
                              "(wheelforge refuses YAML anchors and aliases; write the "
                              "value out)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlProblem(f"{_where(event.start_mark)}: nested more than {MAX_DEPTH} "
                                  "levels deep")
            return Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        """PyYAML's, with a value it cannot make (``2024-02-31``, an integer of 5,000
        digits, ``!!float abc``) a YamlProblem at the node instead of a ValueError."""
        try:
            return super().construct_object(node, deep=deep)
        except (YamlProblem, yaml.YAMLError):
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
            text = str(node.value)
            text = text if len(text) <= 40 else text[:40] + "..."
            raise YamlProblem(f"{_where(node.start_mark)}: cannot read {text!r} as "
                              f"{node.tag.rsplit(':', 1)[-1]}: {exc}") from None

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Node] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first is not None:
                raise YamlProblem(
                    f"line {key_node.start_mark.line + 1}: duplicate key {key!r} (first at "
                    f"line {first.start_mark.line + 1}); a key may appear once per mapping")
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _marked(exc: yaml.MarkedYAMLError) -> str:
    """``line L, column C: PROBLEM (CONTEXT at line L, column C)``: the caller names the
    file (PyYAML's own text names the stream, ``"<unicode string>"``)."""
    problem = exc.problem or "invalid YAML"
    text = f"{_where(exc.problem_mark)}: {problem}" if exc.problem_mark else problem
    if exc.context:
        at = (f" at {_where(exc.context_mark)}" if exc.context_mark is not None
              and exc.context_mark != exc.problem_mark else "")
        text += f" ({exc.context}{at})"
    return text


def decode(data: bytes) -> str:
    """UTF-8 text of ``data``; YamlProblem naming the byte offset otherwise."""
    if len(data) > MAX_BYTES:
        raise YamlProblem(f"{len(data):,} bytes: larger than the {MAX_BYTES:,} bytes a recipe "
                          "or project file may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlProblem(f"byte offset {exc.start}: not UTF-8 (byte 0x{data[exc.start]:02x});"
                          " save the file as UTF-8") from None


def loads(text: str) -> Any:
    """Parse one YAML document with the rules above."""
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # the reader checks the characters here already
        return loader.get_single_data()
    except YamlProblem:
        raise
    except yaml.MarkedYAMLError as exc:  # a syntax error: where and what, without
        raise YamlProblem(_marked(exc)) from None  # PyYAML's 'in "<unicode string>"'
    except yaml.YAMLError as exc:  # ReaderError included
        raise YamlProblem(str(exc)) from None
    except RecursionError:  # not reached with MAX_DEPTH; a last guard
        raise YamlProblem(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_file(path: Path) -> Any:
    """Read and parse ``path``; OSError when it cannot be read, YamlProblem when refused."""
    return loads(decode(path.read_bytes()))


def read_yaml(path: Path, error: type[WheelforgeError], subject: str,
              read_fix: str = "") -> Any:
    """Load a YAML file with the rules above; ``error`` (RecipeError, ConfigError) says
    "cannot read SUBJECT" or "SUBJECT is not valid YAML", with the file and position."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {subject}", why=str(exc), fix=read_fix) from exc
    try:
        return loads(decode(data))
    except YamlProblem as exc:
        raise error(f"{subject} is not valid YAML", why=f"{path}: {exc}",
                    fix="fix the file at the position shown") from None
