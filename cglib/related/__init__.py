"""Related methods beside CLEAR GLASS (memory banks, baselines from neighbouring papers)."""
