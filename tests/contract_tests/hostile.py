"""Hostile output-contract schemas (issue 56), shared by the contract tests and the fuzz corpus."""

REF = "#/$defs/d{}"


def chain(levels, combinator="anyOf"):
    """d_n = combinator[$ref d_n-1, $ref d_n-1], ..., $ref d_levels: one check walks 2^levels subschemas."""
    defs = {"d0": {"type": "integer"}}
    for n in range(1, levels + 1):
        defs[f"d{n}"] = {combinator: [{"$ref": REF.format(n - 1)}, {"$ref": REF.format(n - 1)}]}
    return {"$defs": defs, "$ref": REF.format(levels)}


def items_chain(levels):
    """The chain again, each level one array deeper: the doubling happens down the answer."""
    defs = {"d0": {"type": "integer"}}
    for n in range(1, levels + 1):
        below = {"items": {"$ref": REF.format(n - 1)}}
        defs[f"d{n}"] = {"anyOf": [below, dict(below)]}
    return {"$defs": defs, "$ref": REF.format(levels)}


def deep_refs(levels):
    """A straight line of $refs, `levels` long: no fan-out, only depth."""
    defs = {"d0": {"type": "integer"}}
    for n in range(1, levels + 1):
        defs[f"d{n}"] = {"$ref": REF.format(n - 1)}
    return {"$defs": defs, "$ref": REF.format(levels)}


# Recursive, so counted once at create: it passes the budget. Its `is_valid` of an answer nested
# n arrays deep around a string is instant, but the error list doubles with each level
# (measured: 0.35 s at 12 levels, 16.3 s at 16): the run-time time limit's to stop.
RECURSIVE_FAN_OUT = {
    "$defs": {
        "r": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/r"}, "minItems": 1},
                {"type": "array", "items": {"$ref": "#/$defs/r"}, "maxItems": 9},
            ]
        }
    },
    "$ref": "#/$defs/r",
}


def nested_answer(levels):
    return "[" * levels + '"x"' + "]" * levels


CATASTROPHIC_PATTERN = {"type": "array", "items": {"type": "string", "pattern": "^(a+)+$"}}
FORMATS_DRAFT7 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "array",
    "items": {"anyOf": [{"format": f} for f in ("email", "idn-hostname", "uri", "date-time", "regex", "ipv6")]},
}

# For the fuzz corpus: every one must be refused at create or checked within the time limit.
REFUSED = [chain(16), chain(18), chain(24), chain(16, "allOf"), chain(16, "oneOf"), items_chain(16), deep_refs(100)]
ACCEPTED = [chain(8), RECURSIVE_FAN_OUT, CATASTROPHIC_PATTERN, FORMATS_DRAFT7]
