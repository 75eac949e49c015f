"""index.json from a kernel repo: the entries and the content cache."""
