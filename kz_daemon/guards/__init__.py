"""What a package must pass besides the contract: the static rules, the physics floor, the locked harness, the harness review."""
