"""PDG -> PDG passes and their ordered pipeline (``pipeline.PASSES``)."""
