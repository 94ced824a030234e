"""Figures for every generation: what was drafted, what was kept, where the time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

# finish_reason -> the words the summaries print (generate, chat); "cancelled" reads as "interrupted"
FINISH_WORDS = {
    "stop": "stop (end of text)",
    "length": "length (max tokens reached)",
    "context": "context (the model's context is full)",
    "cancelled": "interrupted",
    "error": "error",
}


def finish_words(reason: str | None) -> str | None:
    return None if reason is None else FINISH_WORDS.get(reason, reason)


@dataclass
class GenerationStats:
    drafter: str = "none"
    prompt_tokens: int = 0
    prompt_tokens_processed: int = 0  # prompt tokens not already in the KV cache
    generated_tokens: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    target_passes: int = 0
    refed_positions: int = 0  # accepted positions the target fed again after a recurrent rollback (core/recurrent.py)
    proposed_by_position: list = field(default_factory=list)
    accepted_by_position: list = field(default_factory=list)
    tokens_speculative: int = 0  # tokens produced in rounds that drafted (k > 0)
    tokens_plain: int = 0  # tokens produced by plain target steps (k = 0)
    prompt_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    generation_time: float = 0.0
    k_history: list = field(default_factory=list)
    stop_reasons: dict = field(default_factory=dict)  # why drafting rounds ended: cap, cost, confidence, no-match
    finish_reason: str | None = None
    tree_rounds: int = 0  # rounds that verified a draft tree (trees/round.py)
    tree_nodes: int = 0  # summed over those rounds: nodes verified,
    tree_depth: int = 0  # the trees' depths,
    tree_path: int = 0  # and accepted path lengths
    tree_siblings_taken: int = 0  # accepted nodes that were a later sibling (where a chain would have stopped)
    tree_lookup_taken: int = 0  # accepted nodes that prompt lookup proposed
    notes: list = field(default_factory=list)
    rounds: list | None = None  # a list (set it before generating; `generate --json` and bench do): each round's
    # work, (draft forwards' widths, target pass width, tokens emitted); None (the default): not recorded
    eos_passes: ClassVar[int | None] = None  # summed totals (session/totals.py): replies that ended on EOS
    near_ties: int = 0  # greedy: emitted tokens whose two best logits were within rounding (core/acceptance.py)
    near_tie_positions: list = field(default_factory=list)  # their indices in the generated tokens (first 100)

    def record_round(self, k: int, n_accepted: int, n_emitted: int, stop_reason: str | None = None,
                     depth: int | None = None):
        """`depth`: for a tree round, its depth (positions counted per depth, not per node)."""
        self.target_passes += 1
        if stop_reason is not None and stop_reason != "plain":
            self.stop_reasons[stop_reason] = self.stop_reasons.get(stop_reason, 0) + 1
        self.k_history.append(k)
        self.draft_proposed += k
        self.draft_accepted += n_accepted
        positions = k if depth is None else depth
        while len(self.proposed_by_position) < positions:
            self.proposed_by_position.append(0)
            self.accepted_by_position.append(0)
        for i in range(positions):
            self.proposed_by_position[i] += 1
            if i < n_accepted:
                self.accepted_by_position[i] += 1
        if k > 0:
            self.tokens_speculative += n_emitted
        else:
            self.tokens_plain += n_emitted

    def record_near_ties(self, start: int, flags) -> None:
        """`flags[i]`: the verify row that chose generated token `start + i` was a near-tie."""
        for i, flag in enumerate(flags):
            if flag:
                self.near_ties += 1
                if len(self.near_tie_positions) < 100:
                    self.near_tie_positions.append(start + i)

    def record_tree(self, nodes: int, depth: int, path: int, siblings_taken: int = 0, lookup_taken: int = 0):
        self.tree_rounds += 1
        self.tree_lookup_taken += lookup_taken
        self.tree_siblings_taken += siblings_taken
        self.tree_nodes += nodes
        self.tree_depth += depth
        self.tree_path += path

    @property
    def tree_summary(self) -> dict | None:
        """Mean tree size, depth and accepted path length per tree round."""
        r = self.tree_rounds
        if not r:
            return None
        return {"rounds": r, "mean_nodes": self.tree_nodes / r, "mean_depth": self.tree_depth / r,
                "mean_accepted_path": self.tree_path / r, "siblings_taken": self.tree_siblings_taken,
                "lookup_taken": self.tree_lookup_taken}

    @property
    def acceptance_rate(self) -> float:
        return self.draft_accepted / self.draft_proposed if self.draft_proposed else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens each target forward pass decided: the generated tokens and the EOS
        that ended the reply (which `generated_tokens` leaves out), over the passes.  Every
        pass decides at least one, so it is never below 1 (a short reply whose EOS took a
        pass of its own used to read 0.50) -- the one definition every report uses (/stats,
        the reply line, --json, the server's stats and page)."""
        if not self.target_passes:
            return 0.0
        eos = self.eos_passes if self.eos_passes is not None else int(self.finish_reason == "stop")
        return (self.generated_tokens + eos) / self.target_passes

    @property
    def mean_drafted(self) -> float:
        """Mean tokens drafted per drafting round (rounds that were plain steps excluded)."""
        rounds = sum(1 for k in self.k_history if k > 0)
        return self.draft_proposed / rounds if rounds else 0.0

    @property
    def acceptance_by_position(self) -> list:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_time if self.prompt_time > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_time if self.generation_time > 0 else 0.0

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_pass=self.tokens_per_pass,
            mean_drafted=self.mean_drafted,
            tree=self.tree_summary,
            acceptance_by_position=self.acceptance_by_position,
            prompt_tps=self.prompt_tps,
            generation_tps=self.generation_tps,
        )
        if self.rounds is not None:
            d["rounds"] = [{"draft_widths": list(dw), "verify_width": v, "emitted": e} for dw, v, e in self.rounds]
        return d

    def summary(self) -> str:
        """The one-line summary printed after a generation."""
        parts = [f"{self.generated_tokens} tokens", f"{self.generation_tps:.2f} tok/s"]
        if self.draft_proposed:
            parts.append(
                f"acceptance {100 * self.acceptance_rate:.1f}% ({self.draft_accepted}/{self.draft_proposed})"
            )
            parts.append(f"{self.tokens_per_pass:.2f} tokens/pass")
            if self.refed_positions:
                parts.append(f"{self.refed_positions} positions re-fed (recurrent rollback)")
            if self.stop_reasons:
                why = " ".join(f"{r} {n}" for r, n in sorted(self.stop_reasons.items(), key=lambda x: -x[1]))
                parts.append(f"drafted {self.mean_drafted:.1f}/round (stops: {why})")
            t = self.tree_summary
            if t:
                parts.append(f"trees {t['mean_nodes']:.1f} nodes, depth {t['mean_depth']:.1f}, "
                             f"path {t['mean_accepted_path']:.1f}")
        parts.append(f"drafter {self.drafter}")
        if self.near_ties:
            parts.append(f"{self.near_ties} near-tie{'s' if self.near_ties != 1 else ''} (top-2 logits within rounding)")
        if any(n.startswith("fallback") for n in self.notes):
            parts.append(f"fell back to plain decoding: {self.tokens_plain} plain / {self.tokens_speculative} speculative tokens")
        parts.append(f"prompt {self.prompt_tokens} tok at {self.prompt_tps:.1f} tok/s")
        if self.finish_reason is not None:
            parts.append(f"finish: {finish_words(self.finish_reason)}")
        return ", ".join(parts)
