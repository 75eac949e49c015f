"""Tools for package authors and submitters: submit, the local dry run, the generated format reference."""
