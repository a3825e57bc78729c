"""observe: the experience store (records, reports, sessions)."""
