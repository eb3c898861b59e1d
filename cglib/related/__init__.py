"""Related methods beside CLEAR GLASS (issue #21): a momentum concept memory, the MCC concept head."""
