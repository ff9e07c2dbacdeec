"""YAML an operator hands the agent (`--config`, `--rules`), loaded with limits before it grows.

`yaml.safe_load` builds nothing dangerous, but it builds anything big: a ten-line document of
anchors that refer to anchors (a "billion laughs") stands for 10⁹ values, and the first code
that walks it (validation, an error message that prints the value) runs out of memory. So the
file's size is bounded before it is parsed, and while it is composed the nesting depth, the
aliases and the size the document would have with every alias expanded are counted; past any
limit it is refused with one line naming the file and the limit.
"""

from __future__ import annotations

from typing import Any

MAX_BYTES = 8 << 20          # a rule file of 10,000 rules is about 1 MB
MAX_DEPTH = 64
MAX_ALIASES = 10_000
MAX_EXPANDED_NODES = 1_000_000


class YamlLimitError(ValueError):
    """The document is over a limit (its message names which, and the limit)."""


def load(path: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, max_aliases: int = MAX_ALIASES,
         max_nodes: int = MAX_EXPANDED_NODES) -> Any:
    """The document in `path`. OSError as `open` raises it, yaml.YAMLError on bad syntax,
    YamlLimitError (without the path: the caller names the file) past a limit."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise YamlLimitError(f"larger than {max_bytes >> 20} MiB: refused before parsing")
    return loads(data, max_depth=max_depth, max_aliases=max_aliases, max_nodes=max_nodes)


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH, max_aliases: int = MAX_ALIASES,
          max_nodes: int = MAX_EXPANDED_NODES) -> Any:
    import yaml
    from yaml.events import AliasEvent
    from yaml.nodes import MappingNode, SequenceNode

    class Loader(yaml.SafeLoader):
        """SafeLoader (the pure-Python composer: the C one cannot be watched) that counts."""

        def __init__(self, stream) -> None:
            super().__init__(stream)
            self._depth = 0
            self._aliases = 0
            self._weight: dict[int, int] = {}  # id(node) → nodes it stands for, aliases expanded

        def compose_node(self, parent, index):
            if self.check_event(AliasEvent):
                self._aliases += 1
                if self._aliases > max_aliases:
                    raise YamlLimitError(f"more than {max_aliases} aliases (*name): refused")
                return super().compose_node(parent, index)
            self._depth += 1
            if self._depth > max_depth:
                raise YamlLimitError(f"nested deeper than {max_depth} levels: refused")
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            weight = 1
            if isinstance(node, SequenceNode):
                weight += sum(self._weight.get(id(child), 1) for child in node.value)
            elif isinstance(node, MappingNode):
                weight += sum(self._weight.get(id(k), 1) + self._weight.get(id(v), 1) for k, v in node.value)
            if weight > max_nodes:
                raise YamlLimitError(f"stands for more than {max_nodes:,} values once its aliases are expanded "
                                     "(anchors that refer to anchors): refused")
            self._weight[id(node)] = weight
            return node

    loader = Loader(data)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
