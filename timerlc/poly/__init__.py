"""The bridge to isl: PDG domains and accesses as isl sets and maps, and the polyhedral
checks built on them."""
