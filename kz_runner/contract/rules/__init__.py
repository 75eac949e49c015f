"""The static rules: what a package's sources may not do, read with ``ast`` and the literal scanner; and the physics floor under its results."""
