"""The reference orders app's tables (loaded from the working tree, not installed)."""
