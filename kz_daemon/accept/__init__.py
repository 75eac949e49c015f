"""The accept saga (two commits), revocation, and index.json."""
