"""Related methods reimplemented beside CLEAR GLASS (issue #21): their heads and helpers."""
