"""What the daemon keeps on disk: the git porcelain and its reader, the log's git anchors, the pending store, stored log tails."""
