"""`make bench`: run every suite, write one JSON file of figures (median of repeats)."""
