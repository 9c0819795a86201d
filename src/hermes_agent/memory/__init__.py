"""Session memory: where conversations are kept and how much of them a prompt sees."""
