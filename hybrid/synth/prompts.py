"""Synthetic prompts for routing profiles in benchmarks: random words, a fixed seed."""

from __future__ import annotations

import random

WORDS = ("the", "river", "city", "market", "history", "light", "engine", "model", "token",
         "expert", "memory", "paper", "road", "music", "winter", "garden", "number", "story",
         "question", "answer", "machine")


def word_prompts(count: int, seed: int = 0, length: tuple[int, int] = (24, 96)) -> list[str]:
    """`count` prompts of length[0]..length[1] random words each, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*length)))
            for _ in range(count)]
