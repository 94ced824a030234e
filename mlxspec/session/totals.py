"""Running totals over a chat session's turns (`Session.stats`, `/stats` in the chat)."""

from __future__ import annotations

from ..core.stats import GenerationStats


class SessionStats:
    """Running totals over a session's turns (one GenerationStats summed field by field)."""

    SUMMED = ("prompt_tokens", "prompt_tokens_processed", "generated_tokens", "draft_proposed", "draft_accepted",
              "target_passes", "tokens_speculative", "tokens_plain", "prompt_time", "draft_time", "verify_time",
              "generation_time")

    def __init__(self):
        self.turns = 0
        self.cancelled = 0
        self.total = GenerationStats(drafter="session")

    def add(self, s: GenerationStats):
        self.turns += 1
        self.cancelled += s.finish_reason == "cancelled"
        t = self.total
        t.eos_passes = (t.eos_passes or 0) + (s.finish_reason == "stop")  # for tokens_per_pass
        for name in self.SUMMED:
            setattr(t, name, getattr(t, name) + getattr(s, name))
        for mine, theirs in ((t.proposed_by_position, s.proposed_by_position),
                             (t.accepted_by_position, s.accepted_by_position)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        t.k_history.extend(s.k_history)

    @property
    def prompt_tokens_reused(self) -> int:
        """Prompt tokens served from the KV cache instead of being processed again."""
        return self.total.prompt_tokens - self.total.prompt_tokens_processed

    def to_dict(self) -> dict:
        d = self.total.to_dict()
        d.pop("k_history", None)
        d.pop("notes", None)
        d.pop("finish_reason", None)
        d.pop("drafter", None)
        d.pop("eos_passes", None)
        return {"turns": self.turns, "cancelled": self.cancelled, "prompt_tokens_reused": self.prompt_tokens_reused, **d}

    def summary(self) -> str:
        t = self.total
        lines = [
            f"turns: {self.turns} ({self.cancelled} interrupted)",
            f"generated: {t.generated_tokens} tokens in {t.generation_time:.2f} s ({t.generation_tps:.2f} tok/s), "
            f"{t.target_passes} target passes"
            + (f" ({t.tokens_per_pass:.2f} tokens/pass)" if t.draft_proposed else ""),  # without drafts: 1 less EOS
        ]
        if t.draft_proposed:
            by_pos = " ".join(f"{100 * a:.0f}%" for a in t.acceptance_by_position)
            lines.append(f"draft: {t.draft_accepted}/{t.draft_proposed} accepted ({100 * t.acceptance_rate:.1f}%); "
                         f"by position: {by_pos}")
            lines.append(f"time: draft {t.draft_time:.2f} s, verify {t.verify_time:.2f} s")
        else:
            lines.append("draft: nothing drafted yet")
        lines.append(f"prompt: {t.prompt_tokens} tokens over all turns, {t.prompt_tokens_processed} processed, "
                     f"{self.prompt_tokens_reused} reused from the KV cache ({t.prompt_time:.2f} s)")
        return "\n".join(lines)


def mean_accepted_length(stats: GenerationStats) -> float:
    """Mean number of draft tokens accepted per drafting round."""
    rounds = sum(1 for k in stats.k_history if k > 0)
    return stats.draft_accepted / rounds if rounds else 0.0
