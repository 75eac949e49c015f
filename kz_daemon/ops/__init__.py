"""The Zoo service facade, start-up recovery, the repository audit, and running a daemon until a signal."""
