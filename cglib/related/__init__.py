"""Related methods beside CLEAR GLASS (issue #21): keyword-permuted hard negatives and their test, a momentum
concept memory, the MCC concept head."""
