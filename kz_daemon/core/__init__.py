"""The daemon's pure domain pieces: clock strings, the user-safe error, fix hints, the submission read model, the scorecard rewrite."""
