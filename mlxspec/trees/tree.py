"""A draft tree: candidate continuations that share prefixes, verified in one pass.

Node i holds a token and its parent (-1: a child of the root, the position right
after the history).  Nodes are stored parents first; a node's children are kept
in the order they were drawn, which is the order the acceptance rule tries them.
For sampling, each node also keeps the distribution q it was drawn from (the
draft's distribution at its parent with the earlier siblings removed; None for a
deterministic proposal, which the rule treats as one-hot).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftTree:
    tokens: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    q: list = field(default_factory=list)  # numpy (V,) proposal per node, or None
    confidence: list = field(default_factory=list)  # the draft's top probability at the parent (None: a lookup token the draft did not propose first)
    rank: list = field(default_factory=list)  # 0 for a first child, 1 for the second, ...
    estimate: list = field(default_factory=list)  # estimated P(target takes it | parent taken), or None
    draft_p: list = field(default_factory=list)  # the draft's probability of the token at its parent, or None
    lookup: list = field(default_factory=list)  # proposed by prompt lookup (q None; a confidence where the draft agreed)
    _children: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.tokens)

    def add(self, token: int, parent: int = -1, q=None, confidence=None, estimate=None, draft_p=None,
            lookup: bool = False) -> int:
        if not -1 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} is not an earlier node")
        kids = self._children.setdefault(parent, [])
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.q.append(q)
        self.confidence.append(confidence)
        self.estimate.append(estimate)
        self.draft_p.append(draft_p)
        self.lookup.append(lookup)
        self.rank.append(len(kids))
        kids.append(len(self.tokens) - 1)
        return len(self.tokens) - 1

    def children(self, node: int = -1) -> list:
        return self._children.get(node, [])

    def depth(self, node: int) -> int:
        d = 0
        while node >= 0:
            d, node = d + 1, self.parents[node]
        return d

    def path(self, node: int) -> list:
        """Nodes from the root's first child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def values(self) -> list:
        """Per node, the product of the estimates along its path: the estimated chance
        that the target takes the path to it (estimates must be set)."""
        out = []
        for i, p in enumerate(self.parents):
            out.append((1.0 if p < 0 else out[p]) * self.estimate[i])
        return out

    def only(self, nodes) -> tuple["DraftTree", dict]:
        """The tree of `nodes` (each one's parent among them, or the root), in their old
        order, and the map from old node indices to new ones (-1: the root)."""
        t, new = DraftTree(), {-1: -1}
        for i in sorted(nodes):
            new[i] = t.add(self.tokens[i], new[self.parents[i]], self.q[i], self.confidence[i], self.estimate[i],
                           self.draft_p[i], self.lookup[i])
        return t, new

    @property
    def max_depth(self) -> int:
        return max((self.depth(i) for i in range(len(self))), default=0)

    @classmethod
    def chain(cls, tokens, q=None, confidence=None) -> "DraftTree":
        t = cls()
        for i, tok in enumerate(tokens):
            t.add(tok, i - 1, None if q is None else q[i], None if confidence is None else confidence[i])
        return t
