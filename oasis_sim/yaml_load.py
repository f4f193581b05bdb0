"""YAML (and JSON) config text to Python values, with alias expansion bounded.

``yaml.safe_load`` shares an aliased node rather than copying it, so a few hundred bytes of nested aliases (the
"billion laughs" file) build a small graph that is a tree of billions of values once anything walks it (a
validation message's ``repr``, a sweep's grid product, ``json.dumps``). ``load_yaml`` composes the document,
counts the values the tree would hold with every alias expanded (in time linear in the file) and refuses a
document over ``MAX_EXPANDED_NODES`` or one that refers to itself, before any Python value is built.
"""

from __future__ import annotations

MAX_EXPANDED_NODES = 100_000  # values a config may hold with its aliases expanded (real configs: under 1,000)


class YamlError(ValueError):
    """Text that is not a YAML document this project accepts; the message says where and why (one line)."""


def _children(node) -> list:
    """A composed node's children: a sequence's items, a mapping's keys and values, a scalar's none."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _expanded_size(root, limit: int) -> int:
    """Nodes of the tree ``root`` stands for (aliases expanded), computed over the shared graph once per node;
    raises ``YamlError`` past ``limit`` or on a node that contains itself."""

    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # iterative post-order walk: (node, children visited?)
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(k)] for k in _children(node))
            if total > limit:
                raise YamlError(f"aliases expand to more than {limit:,} values (a document of at most that many)")
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlError("an alias refers to a node that contains it (a recursive document)")
        on_path.add(key)
        stack.append((node, True))
        for k in _children(node):
            if id(k) in on_path:
                raise YamlError("an alias refers to a node that contains it (a recursive document)")
            if id(k) not in sizes:
                stack.append((k, False))
    return sizes[id(root)]


def load_yaml(text: str, max_nodes: int = MAX_EXPANDED_NODES):
    """The value of the single YAML document ``text`` (None when empty). Raises ``YamlError`` for bad syntax (with
    line and column), for more than one document, and for aliases that expand past ``max_nodes`` values."""
    import yaml

    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses characters YAML does not allow (NUL, ...) here
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, max_nodes)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise YamlError(f"invalid YAML{where}: {getattr(e, 'problem', None) or 'syntax error'}") from None
    except RecursionError:  # nesting deeper than the parser's recursion (thousands of '[')
        raise YamlError("invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
