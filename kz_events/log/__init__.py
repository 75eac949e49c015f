"""The durable log: segment files, the Store (the one writer, group commit), snapshots and replay."""
