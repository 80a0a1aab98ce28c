"""What checking an answer against a JSON Schema can cost, known before any answer: the create-time
budget of output contracts (issue 56).

A schema's bytes say little about its work: `d1 = anyOf[$ref d0, $ref d0]` ... `d18`, `$ref: d18` is
1.2 KB and compiles in 1 ms, but every `$ref` is followed where it stands, so one check of an
answer walks 2^18 subschemas (measured, jsonschema-rs 0.60: 3.6 s and 558 MB of errors at 16
levels, 4 GB at 24). `cost` counts the subschemas a validation walk visits at one place in the
answer, following every `$ref` (and `$dynamicRef`, `$recursiveRef`) where it stands and every
applicator (`allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`, `properties`, `items`, ...), with
each subschema's count computed once (memoized), so counting a chain of 2^60 costs 60 steps.

What the count cannot see, the run-time time limit bounds (batches.engine.checks): a recursive
`$ref` (counted once, since how often it recurses depends on how deep the answer is), the answer's
size (every subschema under `items` runs once per element), and patterns (each match is bounded
by the backtracking limit, not free).
"""

from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin

# Applicators, by where their subschemas apply (every draft from 4 to 2020-12; an unknown keyword is
# not walked, as the validator ignores it): at the same place of the answer, or below it.
ITEM, ANY_KEY = "[]", "*"
IN_PLACE_ONE = (("not", None), ("if", None), ("then", None), ("else", None))
BELOW_ONE = (
    ("items", ITEM),  # an object, or a list in drafts before 2020-12
    ("additionalItems", ITEM),
    ("unevaluatedItems", ITEM),
    ("contains", ITEM),
    ("contentSchema", ITEM),
    ("additionalProperties", ANY_KEY),
    ("unevaluatedProperties", ANY_KEY),
    ("propertyNames", ANY_KEY),
)
LISTS = (("allOf", None), ("anyOf", None), ("oneOf", None), ("prefixItems", ITEM))
REFS = ("$ref", "$dynamicRef", "$recursiveRef")
# A `$ref` the schema does not hold (the validator's bundled meta-schemas, the one kind of remote
# reference it resolves without fetching) counts as this many: the draft 2020-12 meta-schema's
# own count is 181.
EXTERNAL_REF_COST = 500
_EXTERNAL = object()


class TooCostly(Exception):
    """The schema's walk goes past a budget; the message says which and by how much."""


@dataclass(frozen=True)
class Cost:
    nodes: int  # subschemas one check visits at one place in the answer, refs followed
    depth: int  # the deepest nesting of that walk
    recursive: bool  # a $ref cycle: the work grows with the answer's depth (the time limit's to bound)
    patterns: int  # `pattern`s and `patternProperties` among them: each match is up to the backtracking limit


def cost(schema, max_nodes, max_depth):
    """The Cost of checking one place of an answer against `schema` (parsed JSON); raises
    TooCostly past `max_nodes` subschemas or `max_depth` levels, as soon as it is past them."""
    try:
        return _Walk(schema, max_nodes, max_depth).run()
    except RecursionError:  # a max_depth past Python's own stack: refused all the same
        raise TooCostly("its subschemas and references nest too deep to count") from None


class _Walk:
    def __init__(self, root, max_nodes, max_depth):
        self.root, self.max_nodes, self.max_depth = root, max_nodes, max_depth
        self.ids = {}  # absolute $id (no fragment) -> its subschema
        self.anchors = {}  # absolute URI#name -> the subschema of that $anchor
        self.dynamic = {}  # $dynamicAnchor name -> its subschemas ($recursiveAnchor: "")
        self.memo = {}  # id(subschema) -> its count
        self.open = set()  # id() of the subschemas on the walk's path: a $ref back to one is a cycle
        self.recursive = False
        self.patterns = 0
        self._index(root, "", 0)

    def run(self):
        here, below, height = self._visit(self.root, "", 1)
        return Cost(_worst(here, below), height + 1, self.recursive, self.patterns)

    # ----------------------------------------------------------- where references point

    def _index(self, node, base, level):
        if level > self.max_depth * 4:  # nesting the walk could never reach; refused by _visit anyway
            raise TooCostly(f"the schema is nested more than {self.max_depth * 4} levels deep")
        if isinstance(node, list):
            for item in node:
                self._index(item, base, level + 1)
            return
        if not isinstance(node, dict):
            return
        if isinstance(node.get("$id"), str):
            base = urldefrag(urljoin(base, node["$id"]))[0]
            self.ids.setdefault(base, node)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                self.anchors.setdefault(f"{base}#{node[key]}", node)
        if isinstance(node.get("$dynamicAnchor"), str):
            self.dynamic.setdefault(node["$dynamicAnchor"], []).append(node)
        if node.get("$recursiveAnchor") is True:
            self.dynamic.setdefault("", []).append(node)
        for key, value in node.items():
            if key not in ("enum", "const", "examples", "default"):  # values, not schemas
                self._index(value, base, level + 1)

    def _targets(self, keyword, ref, base):
        """The subschemas a reference can land on: one, or (dynamic) every candidate."""
        if keyword == "$recursiveRef":
            return [self._resolve("#", base), *self.dynamic.get("", ())]
        if keyword == "$dynamicRef" and "#" in ref and ref.rsplit("#", 1)[1] in self.dynamic:
            return self.dynamic[ref.rsplit("#", 1)[1]]
        return [self._resolve(ref, base)]

    def _resolve(self, ref, base):
        uri, fragment = urldefrag(urljoin(base, ref))
        doc = self.ids.get(uri, self.root if uri == urldefrag(base)[0] or not uri else None)
        if doc is None:
            return None
        if not fragment:
            return doc
        if not fragment.startswith("/"):
            return self.anchors.get(f"{uri}#{fragment}")
        node = doc
        for part in fragment[1:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                return None
        return node

    # ----------------------------------------------------------- the count

    def _visit(self, node, base, depth):
        """(subschemas the walk visits at the place `node` applies to, {where below: visits
        there}, how many levels below `node` the walk goes)."""
        if node is _EXTERNAL:
            return EXTERNAL_REF_COST, {}, 1
        if not isinstance(node, dict):
            return 1, {}, 0  # true, false, or a value the validator refused at compile already
        key = id(node)
        if key in self.open:
            self.recursive = True  # how often it recurses is the answer's depth: the time limit's
            return 1, {}, 0
        if key not in self.memo:
            self.memo[key] = self._count(node, base, depth)
        here, below, height = self.memo[key]
        if depth + height > self.max_depth:
            raise TooCostly(f"its subschemas and references nest more than {self.max_depth} levels deep")
        return here, below, height

    def _count(self, node, base, depth):
        if depth > self.max_depth:
            raise TooCostly(f"its subschemas and references nest more than {self.max_depth} levels deep")
        if isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])
        self.open.add(id(node))
        here, below, height = 1, {}, 0
        for child, where in self._children(node, base):
            child_here, child_below, child_height = self._visit(child, base, depth + 1)
            height = max(height, child_height + 1)
            if where is None:  # in place: its visits are here, and what it visits below adds up
                here += child_here
                for place, visits in child_below.items():
                    below[place] = below.get(place, 0) + visits
            else:
                below[where] = below.get(where, 0) + _worst(child_here, child_below)
            if _worst(here, below) > self.max_nodes:
                raise TooCostly(
                    f"a check would visit more than {self.max_nodes:,} subschemas at one place of the answer "
                    "and below it, references followed"
                )
        self.open.discard(id(node))
        self.patterns += isinstance(node.get("pattern"), str) + len(_mapping(node.get("patternProperties")))
        return here, below, height

    def _children(self, node, base):
        """(subschema, where it applies): None in place; ITEM an element of the array; ANY_KEY any
        member of the object; "." + name the member `name`."""
        for keyword in REFS:
            ref = node.get(keyword)
            if isinstance(ref, str):
                for target in self._targets(keyword, ref, base):
                    yield (_EXTERNAL if target is None else target), None
        for keyword, where in IN_PLACE_ONE + BELOW_ONE:
            value = node.get(keyword)
            if isinstance(value, list):  # `items` as a list (drafts before 2020-12)
                yield from ((item, where) for item in value)
            elif value is not None:
                yield value, where
        for keyword, where in LISTS:
            value = node.get(keyword)
            if isinstance(value, list):
                yield from ((item, where) for item in value)
        for name, value in _mapping(node.get("properties")).items():
            yield value, "." + name
        for keyword in ("patternProperties",):
            yield from ((value, ANY_KEY) for value in _mapping(node.get(keyword)).values())
        for keyword in ("dependentSchemas", "dependencies"):  # in place, when the member is there
            yield from ((value, None) for value in _mapping(node.get(keyword)).values())


def _worst(here, below):
    """Visits at one place and along the costliest way down from it: an array's elements, or one
    member of an object (those every member gets added to those of the member by name)."""
    any_key = below.get(ANY_KEY, 0)
    named = max((v for k, v in below.items() if k.startswith(".")), default=0)
    return here + max(below.get(ITEM, 0), any_key + named)


def _mapping(value):
    return value if isinstance(value, dict) else {}
