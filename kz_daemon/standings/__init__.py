"""Accepted records over HTTP: operator rankings with their speed of light, and reruns of a record."""
