"""Background care: pruning old runs and rejected uploads, health, the local runner's supervision, mirrors, sd_notify."""
