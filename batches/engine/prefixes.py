"""Prefix-aware dispatch: records whose prompts share a long prefix go out together, to one deployment.

Model servers cache the attention state of prompt prefixes they have seen
recently (vLLM's and SGLang's prefix caches, llama.cpp's prompt cache) and
skip computing it again; the cache holds a few prompts' worth. A batch
whose system prompts are shuffled through the file, sent in file order,
finds its prefix evicted by the time the next record with it arrives.

- **The key** of a record is a CRC-32 of the first OPENRELAY_PREFIX_BYTES
  bytes of its prompt as the input line spells it (from `"messages"`,
  `"input"` or `"prompt"` on), read from the line when it is claimed: no
  parse, and the same on every engine. A prompt shorter than that has no key
  (nothing long to share).
- **Together**: a batch's claimed records wait in a `RecordQueue`, grouped by
  key; a group is served whole before the next (oldest first), and records
  without a key keep their file order. Once a batch's claims show repeated
  keys, its engine claims OPENRELAY_PREFIX_WINDOW records ahead (not the
  rate-sized few), so groups have members to send together.
- **One deployment**: with several deployments, a record's calls prefer the
  deployment its key hashes to (rendezvous hashing over the deployment ids:
  the same on every engine, and a deployment leaving moves only its own
  keys); when that one is full, any deployment with room takes the call, so
  no capacity idles for the sake of a cache.
"""

import zlib
from collections import OrderedDict, deque
from contextvars import ContextVar

PROMPT_NAMES = (b'"messages"', b'"input"', b'"prompt"')

# The key of the record the running slot works on: its calls read it (fairness.CallGate).
current_key = ContextVar("current_key", default=None)


def prefix_key(line, size):
    """The key of the first `size` bytes of the record's prompt, or None (no such prompt, or `size` 0)."""
    if not size:
        return None
    for name in PROMPT_NAMES:
        at = line.find(name)
        if at >= 0:
            start = at + len(name)
            piece = line[start : start + size]
            return zlib.crc32(piece) if len(piece) == size else None
    return None


_M64 = (1 << 64) - 1


def _mix(x):
    """splitmix64's finalizer: every input bit moves every output bit (CRC-32 alone is linear,
    and one deployment won every key)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def home_of(key, upstreams):
    """The deployment a key's calls prefer: the highest score of (key, deployment)."""
    best, best_score = None, -1
    for upstream in upstreams:
        score = _mix((key << 32) | zlib.crc32(upstream.affinity_seed))
        if score > best_score:
            best, best_score = upstream, score
    return best


class RecordQueue:
    """A batch's claimed records waiting to start, as (ClaimedRecord, line) pairs: grouped by prompt
    prefix, each group served whole before the next; records without a key stay in file order.

    `marked`: the pks of its records marked sent ahead of their start, or being marked
    (trips.SentMarks): a record leaves it as it leaves the queue, so the marks' cap reads a count
    instead of walking the queue (the walk, once a mark statement, was 5% of a worker's CPU)."""

    __slots__ = ("_groups", "_size", "_solo", "marked")

    def __init__(self, items=(), marked=None):
        self._groups = OrderedDict()  # key -> deque of items; the oldest group first
        self._size = 0
        self._solo = 0  # names runs of keyless records
        self.marked = set() if marked is None else marked
        self.extend(items)

    def extend(self, items):
        groups = self._groups
        for item in items:
            key = item[0].prefix
            if key is None:
                # Keyless records join the newest group if it is a keyless run, so they keep their order.
                last = next(reversed(groups), None) if groups else None
                if isinstance(last, tuple):
                    groups[last].append(item)
                else:
                    self._solo += 1
                    groups[("solo", self._solo)] = deque((item,))
            else:
                group = groups.get(key)
                if group is None:
                    groups[key] = deque((item,))
                else:
                    group.append(item)
            self._size += 1

    def popleft(self):
        groups = self._groups
        key = next(iter(groups))
        group = groups[key]
        item = group.popleft()
        if not group:
            del groups[key]
        self._size -= 1
        if self.marked:
            self.marked.discard(item[0].pk)
        return item

    def clear(self):
        self._groups.clear()
        self._size = 0
        self.marked.clear()

    def __len__(self):
        return self._size

    def __iter__(self):
        for group in self._groups.values():
            yield from group

    def shared(self):
        """Whether any key has more than one record waiting."""
        return any(len(group) > 1 for key, group in self._groups.items() if not isinstance(key, tuple))
