"""The reference orders app's agents (loaded from the working tree, not installed)."""
