"""Reading the log for people and tests: the audit, a submission's story, simulated workloads."""
