"""Test helpers shared between test modules."""
