"""The scripts of bench/ run at a tiny size: they run and print their figures; timing is never
asserted."""
