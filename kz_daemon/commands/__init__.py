"""`kz` subcommands; each module imports only the standard library at top level."""
