"""The history projection: finished submissions on disk, and reading across it and the live State.

``history`` is the SQLite file the store writes (``History``); ``reading`` finds a
submission wherever it is (live, handed off, stored) and gives tools a read-only
``View`` of a state directory.
"""
