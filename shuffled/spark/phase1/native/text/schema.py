"""The schema a task's JSON is read with: the fields the spec needs, typed by their values.

A tree of what is read from each record: object keys, an array's elements (for flatten
index steps), leaves with their current Arrow type. :class:`shuffled.spark.phase1.native.text.json_lines.JsonParser` changes
a leaf's type when pyarrow meets a value of another kind, so each run of rows is read with
the types its values have.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

Steps = tuple[str | int, ...]
#: The Arrow type a leaf takes for a JSON kind (a leaf never seen but null: text).
LEAF = {"string": pa.string(), "number": pa.int64(), "boolean": pa.bool_(), "null": pa.string()}


@dataclass
class Node:
    """The schema tree of what is read: object keys (``keys``), an array's elements
    (``items``, for index steps) or a leaf value (``leaf`` set: its current Arrow type)."""

    keys: dict[str, Node] | None = None
    items: Node | None = None
    leaf: pa.DataType | None = None
    multi: bool = False  # a leaf that may be an array of strings (multi-value dimension)
    text: bool = False  # a leaf whose text is used (an integer read as float64 would differ)
    scalar: pa.DataType | None = None  # an object/array node met as a scalar: this type

    def arrow(self) -> pa.DataType:
        if self.scalar is not None:
            return self.scalar
        if self.leaf is not None:
            return self.leaf
        if self.items is not None:
            return pa.list_(self.items.arrow())
        return pa.struct([(k, v.arrow()) for k, v in (self.keys or {}).items()])


def schema_tree(paths: dict[str, Steps], multi: set[str], numbers: set[str] = frozenset(),  # type: ignore[assignment]
                texts: set[str] = frozenset()) -> Node:  # type: ignore[assignment]
    """The tree reading every ``paths`` value (a field's steps from the record's root);
    ``numbers`` are first read as integers (metric fields), the others as text, until a
    value of another kind says otherwise."""
    root = Node(keys={})
    for name, steps in paths.items():
        node = root
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            if isinstance(step, int):
                node.items = node.items or Node(keys={})
                child = node.items
            else:
                assert node.keys is not None
                child = node.keys.setdefault(step, Node(keys={}))
            if last:
                child.keys, child.leaf = None, pa.int64() if name in numbers else pa.string()
                child.multi = name in multi and len(steps) == 1
                child.text = name in texts
            node = child
    return root


def find(root: Node, path: str) -> Node | None:
    """The node at pyarrow's ``/key/[]/key`` column path (None: not read)."""
    node: Node | None = root
    for part in [p for p in path.split("/") if p]:
        if node is None:
            return None
        node = node.items if part == "[]" else (node.keys or {}).get(part)
    return node


def leaves(node: Node) -> list[Node]:
    """Every leaf under ``node``."""
    if node.leaf is not None:
        return [node]
    out = []
    for child in [*(node.keys or {}).values(), *([node.items] if node.items else [])]:
        out += leaves(child)
    return out
